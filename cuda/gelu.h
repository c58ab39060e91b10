// Host launchers for the GELU kernels (cuda/gelu.cu), callable from g++-compiled code: raw
// device pointers whose element type is `dtype` (f32 or bf16; bf16 is stored as 16-bit
// bfloat16, math is fp32), and a cudaStream_t passed as void* (nullptr: the default stream).
// Launches are asynchronous. A bad dtype throws RuntimeError before anything is launched.
#pragma once
#include <cstddef>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// out[i] = gelu(inp[i]) for i < n, tanh approximation (GPT-2). out may alias inp.
void gelu_forward(DType dtype, void* out, const void* inp, size_t n, void* stream = nullptr);
// dinp[i] = gelu'(inp[i]) * dout[i] for i < n (overwrites, as Ops::gelu_backward says). dinp may
// alias dout (each thread reads its elements before it writes them).
void gelu_backward(DType dtype, void* dinp, const void* inp, const void* dout, size_t n, void* stream = nullptr);

}  // namespace pt::gpu
