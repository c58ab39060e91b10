// Host launchers for the SwiGLU kernels (cuda/swiglu.cu), callable from g++-compiled code: raw
// device pointers whose element type is `dtype` (f32 or bf16; math in fp32), and a cudaStream_t
// passed as void* (nullptr: the default stream). Launches are asynchronous. A bad dtype or shape
// throws RuntimeError before anything is launched.
#pragma once
#include "core/tensor/tensor.h"

namespace pt::gpu {

// gate_up [N, 2H] holds rows gate (H) | up (H): out [N, H] = silu(gate) * up,
// silu(g) = g / (1 + exp(-g)).
void swiglu_forward(DType dtype, void* out, const void* gate_up, int N, int H, void* stream = nullptr);
// dgate_up [N, 2H] = (dout * up * silu'(gate) | dout * silu(gate)), overwritten
// (Ops::swiglu_backward). It must not overlap gate_up or dout.
void swiglu_backward(DType dtype, void* dgate_up, const void* gate_up, const void* dout, int N, int H,
                     void* stream = nullptr);

}  // namespace pt::gpu
