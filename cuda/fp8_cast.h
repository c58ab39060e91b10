// Host launchers for the FP8 cast kernels (cuda/fp8_cast.cu), callable from g++-compiled code:
// the largest magnitudes of a tensor (whole, per row or per column), and its quantisation to FP8
// codes with power-of-two scales (one, or one per row of the codes)
// (core/common/fp8.h: the same rounding as CpuOps, bit for bit). Raw device pointers; `dtype` is
// the input's element type (f32 or bf16), `q_dtype` the codes' format (f8e4m3 or f8e5m2); a
// cudaStream_t passed as void* (nullptr: the default stream). Launches are asynchronous. A bad
// dtype throws RuntimeError before anything is launched.
#pragma once
#include <cstddef>

#include "core/common/fp8.h"
#include "core/tensor/tensor.h"

namespace pt::gpu {

// The largest magnitudes of x [rows, cols] (core/common/fp8.h's Fp8Amax): over = tensor: amax[0]
// of the whole; rows: amax[r] of each row; cols: amax[c] of each column (0 for an empty set), as
// floats; a NaN in x wins (its magnitude's bits are the largest), as in CpuOps. Overwrites every
// entry (tensor and cols: zeroed first on the stream, then integer atomicMax; rows: one store each).
void fp8_amax(DType dtype, float* amax, const void* x, int rows, int cols, Fp8Amax over, void* stream = nullptr);

// q = code(x * s) for x [rows, cols], stored [rows, cols] or, with `transpose`, [cols, rows]; let R
// be q's rows. Without per_row: s = 2^fp8_scale_exponent(A, format), A the largest of
// amaxes[0 .. n_amax) (device f32s, read by the kernel: no host round trip); scale_inv[0] = 1 / s.
// With per_row: q's row i has its own s_i from the largest of amaxes[k * R + i], k < n_amax, and
// scale_inv[i] = 1 / s_i (R entries). n_amax >= 1.
// record_amax (nullptr: none; not with per_row, which throws): one device f32 that becomes the
// larger of itself and x's largest magnitude (bits compared as integers: a NaN wins), from the
// values the cast reads anyway, by one integer atomicMax per block: it accumulates across calls
// (no memset here; the caller zeroes it), deterministic. It must hold a magnitude (sign bit
// clear, as 0 or an earlier record does), else the integer max would keep it as it is.
void fp8_quantize(DType dtype, DType q_dtype, void* q, float* scale_inv, const void* x, const float* amaxes,
                  int n_amax, int rows, int cols, bool transpose, bool per_row, float* record_amax = nullptr,
                  void* stream = nullptr);

}  // namespace pt::gpu
