// Host launcher for FP8 decoding (cuda/fp8_dequantize.cu), callable from g++-compiled code.
#pragma once
#include <cstddef>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// out[i] = the value of code q[i] (q_dtype f8e4m3 or f8e5m2) times scale_inv[0] (a device f32),
// for n elements, written as out_dtype (f32 or bf16). Raw device pointers; asynchronous on
// `stream` (a cudaStream_t as void*; nullptr: the default stream). A bad dtype throws.
void fp8_dequantize(DType out_dtype, void* out, DType q_dtype, const void* q, const float* scale_inv, size_t n,
                    void* stream = nullptr);

}  // namespace pt::gpu
