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

// Scratch bytes layernorm_backward needs (fp32 partial sums for dw and db).
size_t layernorm_backward_scratch_bytes(int N, int C);

// The backward of layernorm_forward, ACCUMULATING (the Ops convention), with xhat = (x - mean) * rstd
// and g = w * dout:
//   dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))      (dtype, may be nullptr)
//   dw   += sum_n xhat * dout,  db += sum_n dout                    (grad_dtype, each may be nullptr)
// Deterministic (no atomics). `scratch` holds layernorm_backward_scratch_bytes(N, C) bytes.
void layernorm_backward(DType dtype, DType grad_dtype, void* dinp, void* dw, void* db, const void* dout,
                        const void* inp, const void* w, const float* mean, const float* rstd, int N, int C,
                        void* scratch, void* stream = nullptr);

}  // namespace pt::gpu
