// Host launchers for the elementwise kernels (cuda/elementwise.cu), callable from g++-compiled
// code: raw device pointers whose element type is the DType given, and a cudaStream_t passed as
// void* (nullptr: the default stream). Launches are asynchronous; a dtype the kernels do not
// handle throws RuntimeError before anything is launched.
#pragma once
#include <cstddef>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// out[i] = a[i] + b[i] (f32 or bf16, one rounding). out may alias a or b.
void add(DType dtype, void* out, const void* a, const void* b, size_t n, void* stream = nullptr);
// x[i] *= s (f32 or bf16).
void scale(DType dtype, void* x, float s, size_t n, void* stream = nullptr);
// dst[i] = src[i] converted (f32 <-> bf16, rounding to nearest even; same dtype: a copy). The
// two ranges must not overlap unless dst == src and the dtypes match.
void convert(DType dst_dtype, void* dst, DType src_dtype, const void* src, size_t n, void* stream = nullptr);
// out[r, c] += bias[c] for r < rows, c < cols (the matmul's bias when cuBLASLt cannot fuse it).
void add_bias_rows(DType dtype, void* out, const void* bias, int rows, int cols, void* stream = nullptr);

}  // namespace pt::gpu
