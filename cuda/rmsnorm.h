// Host launchers for the RMSNorm kernels (cuda/rmsnorm.cu), callable from g++-compiled code: raw
// device pointers whose element type is `dtype` (f32 or bf16, the compute dtype: activations and
// weights), fp32 statistics, a cudaStream_t passed as void* (nullptr: the default stream).
// Launches are asynchronous. Bad arguments throw RuntimeError before anything is launched.
#pragma once
#include <cstddef>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// Per row n < N of inp[N, C]: rstd = 1 / sqrt(mean(inp^2) + eps), out = (inp * rstd) * w
// (Hugging Face's LlamaRMSNorm). rstd[N] (f32) is written for backward; it may be nullptr. out
// may alias inp.
void rmsnorm_forward(DType dtype, void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps,
                     void* stream = nullptr);

// The residual add fused with the RMSNorm that follows it:
//   residual = a + b   (rounded to dtype: the stored residual stream)
//   out, rstd = rmsnorm(residual, w)
// The RMSNorm sees exactly the stored (rounded) residual, and sums it in the order
// rmsnorm_forward does when both take the same 16-byte or scalar path. residual may alias a or b.
void fused_residual_rmsnorm_forward(DType dtype, void* residual, void* out, float* rstd, const void* a,
                                    const void* b, const void* w, int N, int C, float eps, void* stream = nullptr);

// The backward: norm_backward.h.

}  // namespace pt::gpu
