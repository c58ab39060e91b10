// Host launchers for the grouped products of the routed experts (cuda/grouped_matmul.cu),
// callable from g++-compiled code: raw device pointers, bf16 operands, fp32 accumulation, and a
// cudaStream_t passed as void*. The groups' rows come from offsets [G + 1] (i32) in device memory,
// read by the kernels themselves: nothing waits for the host. The contracts are Ops'
// grouped_matmul_forward / grouped_matmul_backward (core/ops/ops.h); `rows` bounds offsets[G].
#pragma once
#include <cstdint>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// Whether the tensor-core kernels take these products: bf16 activations, 1 to 1024 groups, and IC
// and OC multiples of 8 (every row a whole number of 16-byte chunks). Otherwise the caller runs
// the groups one by one.
bool grouped_matmul_fits(DType act, int G, int IC, int OC);

// out[r0:r1] = inp[r0:r1] @ weight[g]^T for each group g (out [rows, OC], inp [rows, IC], weight
// [G, OC, IC]); rows past offsets[G] untouched.
void grouped_matmul_forward(void* out, const void* inp, const void* weight, const int32_t* offsets, int G, int rows,
                            int IC, int OC, void* stream);
// dinp[r0:r1] = dout[r0:r1] @ weight[g] (dinp [rows, IC], dout [rows, OC]).
void grouped_matmul_backward_input(void* dinp, const void* dout, const void* weight, const int32_t* offsets, int G,
                                   int rows, int IC, int OC, void* stream);
// dweight[g] += dout[r0:r1]^T @ inp[r0:r1] (dweight [G, OC, IC] in dw_type: bf16 or f32).
void grouped_matmul_backward_weight(DType dw_type, void* dweight, const void* dout, const void* inp,
                                    const int32_t* offsets, int G, int IC, int OC, void* stream);

}  // namespace pt::gpu
