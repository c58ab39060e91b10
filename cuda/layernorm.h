// Host launchers for the LayerNorm kernels (cuda/layernorm.cu), callable from
// g++-compiled code: raw device pointers whose element type is `dtype` (f32 or bf16, the compute
// dtype: activations and weights), fp32 statistics, a cudaStream_t passed as void* (nullptr: the
// default stream). Launches are asynchronous. Bad arguments throw RuntimeError before anything
// is launched.
#pragma once
#include "core/tensor/tensor.h"

namespace pt::gpu {

// Per row n < N of inp[N, C]: out = (inp - mean) * rstd * w + b, eps 1e-5, biased variance
// (GPT-2). mean[N] and rstd[N] (f32) are written for backward; either may be nullptr when not
// needed. out may alias inp.
void layernorm_forward(DType dtype, void* out, float* mean, float* rstd, const void* inp, const void* w,
                       const void* b, int N, int C, void* stream = nullptr);

// The residual add fused with the LayerNorm that follows it (llm.c's fused_residual_forward):
//   residual = a + b   (rounded to dtype: this is the stored residual stream)
//   out, mean, rstd = layernorm(residual, w, bias)
// One pass over the inputs instead of two kernels; the LayerNorm sees exactly the stored
// (rounded) residual, as backward will. residual may alias a or b.
void fused_residual_layernorm_forward(DType dtype, void* residual, void* out, float* mean, float* rstd,
                                      const void* a, const void* b, const void* w, const void* bias, int N, int C,
                                      void* stream = nullptr);

// The backward: norm_backward.h.

}  // namespace pt::gpu
