// Host launchers for the backward of LayerNorm and RMSNorm (cuda/norm_backward.cu; the forwards
// are in layernorm.h and rmsnorm.h), callable from g++-compiled code: raw device pointers whose
// element type is `dtype` (f32 or bf16, the compute dtype: activations and weights), gradients
// in `grad_dtype`, fp32 statistics, a cudaStream_t passed as void* (nullptr: the default
// stream). Launches are asynchronous. Bad arguments throw RuntimeError before anything is
// launched. Both are deterministic (no atomics: the same bits on every run and every GPU).
#pragma once
#include <cstddef>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// Scratch bytes layernorm_backward / rmsnorm_backward need (fp32 partial sums of the weight and
// bias gradients).
size_t layernorm_backward_scratch_bytes(int N, int C);
size_t rmsnorm_backward_scratch_bytes(int N, int C);

// The backward of layernorm_forward, ACCUMULATING (the Ops convention), with
// xhat = (x - mean) * rstd and g = w * dout:
//   dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))      (dtype, may be nullptr)
//   dw   += sum_n xhat * dout,  db += sum_n dout                    (grad_dtype, each may be nullptr)
// `scratch` holds layernorm_backward_scratch_bytes(N, C) bytes.
void layernorm_backward(DType dtype, DType grad_dtype, void* dinp, void* dw, void* db, const void* dout,
                        const void* inp, const void* w, const float* mean, const float* rstd, int N, int C,
                        void* scratch, void* stream = nullptr);

// The backward of rmsnorm_forward, ACCUMULATING, with xhat = x * rstd and g = w * dout:
//   dinp += rstd * (g - xhat * mean_c(g * xhat))     (dtype, may be nullptr)
//   dw   += sum_n xhat * dout                         (grad_dtype, may be nullptr)
// `scratch` holds rmsnorm_backward_scratch_bytes(N, C) bytes.
void rmsnorm_backward(DType dtype, DType grad_dtype, void* dinp, void* dw, const void* dout, const void* inp,
                      const void* w, const float* rstd, int N, int C, void* scratch, void* stream = nullptr);

}  // namespace pt::gpu
