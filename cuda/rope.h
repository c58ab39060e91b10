// Host launchers for the rotary position embedding kernels (cuda/rope.cu), callable from
// g++-compiled code: raw device pointers whose element type is `dtype` (f32 or bf16; math in
// fp32), int32 positions on the device, and a cudaStream_t passed as void* (nullptr: the default
// stream). Launches are asynchronous. A bad dtype or shape throws RuntimeError before anything is
// launched.
#pragma once
#include <cstdint>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// In place on qkv [B, T, row_width]: the first rot_heads heads (HS wide) of every row are rotated
// by angle = float(pos[t]) * inv_freq_i, inv_freq_i = 1 / theta^(2i/HS), pairing dimension i
// with i + HS/2 (Hugging Face's rotate-half convention; see Ops::rope_forward). HS <= 512.
void rope_forward(DType dtype, void* qkv, const int32_t* pos, int B, int T, int row_width, int rot_heads, int HS,
                  float theta, void* stream = nullptr);
// The transpose rotation (by -angle) of the same heads of dqkv, in place: rope_forward's backward.
void rope_backward(DType dtype, void* dqkv, const int32_t* pos, int B, int T, int row_width, int rot_heads, int HS,
                   float theta, void* stream = nullptr);

}  // namespace pt::gpu
