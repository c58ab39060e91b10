// Deterministic column sums of a row-major [N, C] activation gradient, for the parameter
// gradients that are sums over tokens: a bias gradient (sum_n dout[n, c]) and a norm's weight
// gradient (sum_n xhat[n, c] * dout[n, c]: LayerNorm's xhat = (x - mean) * rstd, RMSNorm's
// x * rstd). Included by layernorm.cu, rmsnorm.cu and matmul_cublaslt.cu; device code only.
//
// Algorithm: two kernels, no atomics, so the result is bitwise the same on every run:
//   1. column_partials_kernel: block (x, y) covers channels [x*256, x*256 + 256) and the
//      y-th chunk of rows; each thread walks its channel down the chunk's rows in order (a
//      warp reads 32 consecutive channels of one row per step: coalesced), summing in fp32,
//      and writes one partial per channel and chunk to fp32 scratch [chunks][C];
//   2. column_finalize_kernel: one thread per channel sums the chunks' partials in order and
//      adds the total to the gradient (f32 or bf16) once.
// The row chunking depends on N only (ColumnSplit), never on the device.
// Memory traffic: the partials pass reads N*C*s (plus N*C*s of the input and 8N of the
// statistics for LayerNorm); the partials are 4*chunks*C bytes, written once and read once
// (chunks <= 256, so <= 1 KB per channel: small next to N*C*s at training shapes).
#pragma once
#include "cuda/cuda_common.h"

namespace pt::gpu {

constexpr int kColumnBlock = 256;

// How the rows are split into chunks: at least 32 rows per chunk (enough work per thread) and at
// most 256 chunks (a short finalize pass).
struct ColumnSplit {
  int rows_per_chunk, chunks;
  ColumnSplit(int N) {
    rows_per_chunk = N / 256 + (N % 256 != 0);
    if (rows_per_chunk < 32) rows_per_chunk = 32;
    chunks = N > 0 ? (N + rows_per_chunk - 1) / rows_per_chunk : 0;
  }
  // fp32 scratch for `sums` partial sums per channel.
  size_t scratch_bytes(int C, int sums) const { return size_t(chunks) * C * sums * sizeof(float); }
};

// kLayerNorm: partial_a = sum xhat * dout (the weight gradient), partial_b = sum dout (the bias),
// with xhat = (x - mean) * rstd; a null mean means no centring (RMSNorm: xhat = x * rstd) and a
// null partial_b no bias (RMSNorm has none). Otherwise only partial_b (a bias gradient); inp,
// mean, rstd and partial_a are unused.
template <typename T, bool kLayerNorm>
__global__ void __launch_bounds__(kColumnBlock)
    column_partials_kernel(float* partial_a, float* partial_b, const T* dout, const T* inp, const float* mean,
                           const float* rstd, int N, int C, int rows_per_chunk) {
  const int c = blockIdx.x * kColumnBlock + threadIdx.x;
  if (c >= C) return;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(N, r0 + rows_per_chunk);
  float a = 0.0f, b = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const size_t i = static_cast<size_t>(r) * C + c;
    const float dy = to_float(dout[i]);
    b += dy;
    // x - 0 is exactly x: RMSNorm's sum is x * rstd * dy, CpuOps's order.
    if constexpr (kLayerNorm) a += (to_float(inp[i]) - (mean ? mean[r] : 0.0f)) * rstd[r] * dy;
  }
  const size_t out = static_cast<size_t>(blockIdx.y) * C + c;
  if (partial_b) partial_b[out] = b;
  if constexpr (kLayerNorm) partial_a[out] = a;
}

// grad_x[c] += sum_k partial_x[k, c] for x in {a, b}; a null gradient (or partial) is skipped.
template <typename G>
__global__ void __launch_bounds__(kColumnBlock)
    column_finalize_kernel(G* grad_a, G* grad_b, const float* partial_a, const float* partial_b, int chunks, int C) {
  const int c = blockIdx.x * kColumnBlock + threadIdx.x;
  if (c >= C) return;
  if (grad_a && partial_a) {
    float s = 0.0f;
    for (int k = 0; k < chunks; ++k) s += partial_a[static_cast<size_t>(k) * C + c];
    grad_a[c] = from_float<G>(to_float(grad_a[c]) + s);
  }
  if (grad_b && partial_b) {
    float s = 0.0f;
    for (int k = 0; k < chunks; ++k) s += partial_b[static_cast<size_t>(k) * C + c];
    grad_b[c] = from_float<G>(to_float(grad_b[c]) + s);
  }
}

// Launches column_finalize_kernel over C channels (the one entry point: callers never pick its
// grid, so the kernel's shape can change in one place).
template <typename G>
void launch_column_finalize(G* grad_a, G* grad_b, const float* partial_a, const float* partial_b, int chunks, int C,
                            cudaStream_t stream) {
  column_finalize_kernel<G><<<ceil_div(C, kColumnBlock), kColumnBlock, 0, stream>>>(grad_a, grad_b, partial_a,
                                                                                    partial_b, chunks, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pt::gpu
