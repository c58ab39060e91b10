// Deterministic column sums of a row-major [N, C] activation gradient, for the parameter
// gradients that are sums over tokens: a bias gradient (sum_n dout[n, c]) and a norm's weight
// and bias gradients (whose kernels write their own per-chunk partials and finish with
// launch_column_finalize). Included by the .cu files that need them; device code only.
//
// Algorithm: two kernels, no atomics, so the result is bitwise the same on every run:
//   1. column_partials_kernel (launch_column_partials, the bias gradient): block (x, y) covers
//      a tile of 32 * VEC channels and the y-th chunk of rows. Each lane owns VEC adjacent
//      channels, loaded as one 16-byte vector (8 bf16 or 4 fp32; VEC = 1, a scalar path, when
//      the rows are not 16-byte aligned), so a warp reads 512 contiguous bytes of a row per
//      load (64 or 128 on the scalar path). The block's 8 warps take the chunk's rows in turn
//      (warp w: rows w, w + 8, ...), with kRowsInFlight rows' loads issued before they are
//      added, each warp summing its rows in order in fp32. The 8 warp sums are then added in
//      warp order (shared memory) into one partial per channel and chunk, in fp32 scratch
//      [chunks][C];
//   2. column_finalize_kernel (launch_column_finalize): block x covers 32 channels, one per
//      lane; warp w sums the chunks k = w, w + 32, ... in order, then the 32 warp sums are added
//      in warp order and the total is added to the gradient (f32 or bf16) once. The fixed
//      subsets spread a channel's loads over 32 warps (each with several in flight) instead of
//      one thread walking all the chunks.
// The row chunking depends on N only (ColumnSplit), never on the device, and so do the orders.
// Memory traffic: the partials pass reads N*C*s; the partials are 4*chunks*C bytes, written once
// and read once (chunks <= 256, so <= 1 KB per channel: small next to N*C*s at training shapes).
#pragma once
#include <type_traits>

#include "cuda/cuda_common.h"

namespace pt::gpu {

constexpr int kColumnWarps = 8;  // warps per block of column_partials_kernel
// Warps per block of column_finalize_kernel: a channel's chunks are summed by this many warps (a
// fixed subset each), so up to 2048 chunks (the norm backward's) take 64 loads a warp.
constexpr int kFinalizeWarps = 32;
constexpr int kColumnThreads = kColumnWarps * kWarpSize;
constexpr int kRowsInFlight = 4;  // rows each lane loads before adding (column_partials_kernel)

// How the rows are split into chunks: at least 32 rows per chunk (enough work per block) and at
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

// partial[y, c] = sum of dout[r, c] over the rows r of chunk y, for the 32 * VEC channels of
// block x (see the header). With VEC > 1, dout and C must keep every row 16-byte aligned.
template <typename T, int VEC>
__global__ void __launch_bounds__(kColumnThreads)
    column_partials_kernel(float* partial, const T* dout, int N, int C, int rows_per_chunk) {
  constexpr int kTile = kWarpSize * VEC;  // channels per block
  __shared__ float warp_sums[kColumnWarps][kTile];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int c0 = blockIdx.x * kTile;
  const int c = c0 + lane * VEC;  // this lane's first channel; C % VEC == 0, so all VEC are in range
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(N, r0 + rows_per_chunk);
  float acc[VEC] = {};
  if (c < C) {
    for (int r = r0 + warp; r < r1; r += kColumnWarps * kRowsInFlight) {
      Packed<T, VEC> x[kRowsInFlight];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        const int row = r + u * kColumnWarps;
        if (row < r1) x[u] = load_packed<T, VEC>(dout + static_cast<size_t>(row) * C + c);
      }
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        if (r + u * kColumnWarps >= r1) break;
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] += to_float(x[u].v[v]);
      }
    }
  }
#pragma unroll
  for (int v = 0; v < VEC; ++v) warp_sums[warp][lane * VEC + v] = acc[v];
  __syncthreads();
  for (int i = threadIdx.x; i < kTile && c0 + i < C; i += kColumnThreads) {
    float s = warp_sums[0][i];
#pragma unroll
    for (int w = 1; w < kColumnWarps; ++w) s += warp_sums[w][i];
    partial[static_cast<size_t>(blockIdx.y) * C + c0 + i] = s;
  }
}

// fp32 partial sums [chunks][C] of the columns of dout [N, C] (a bias gradient's first pass;
// launch_column_finalize finishes it); returns chunks. `partial` holds
// ColumnSplit(N).scratch_bytes(C, 1).
template <typename T>
int launch_column_partials(float* partial, const T* dout, int N, int C, cudaStream_t stream) {
  const ColumnSplit split(N);
  if (split.chunks == 0 || C <= 0) return split.chunks;
  constexpr int kVec = 16 / sizeof(T);
  auto launch = [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    const dim3 grid(static_cast<unsigned>(ceil_div(C, kWarpSize * VEC)), static_cast<unsigned>(split.chunks));
    column_partials_kernel<T, VEC><<<grid, kColumnThreads, 0, stream>>>(partial, dout, N, C, split.rows_per_chunk);
  };
  if (vec16_ok<T>(C, {dout})) {
    launch(std::integral_constant<int, kVec>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
  CUDA_CHECK_LAUNCH();
  return split.chunks;
}

// grad[c] += sum_k partial[k, c] for the block's 32 channels (see the header); every thread of
// the block calls it.
template <typename G>
__device__ __forceinline__ void finalize_columns(G* grad, const float* partial, int chunks, int C,
                                                 float (&warp_sums)[kFinalizeWarps][kWarpSize]) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int c = blockIdx.x * kWarpSize + lane;
  float s = 0.0f;
  if (c < C) {
#pragma unroll 8
    for (int k = warp; k < chunks; k += kFinalizeWarps) s += partial[static_cast<size_t>(k) * C + c];
  }
  warp_sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && c < C) {
    float total = warp_sums[0][lane];
#pragma unroll
    for (int w = 1; w < kFinalizeWarps; ++w) total += warp_sums[w][lane];
    grad[c] = from_float<G>(to_float(grad[c]) + total);
  }
  __syncthreads();  // warp_sums is reused by the next call
}

// grad_x[c] += sum_k partial_x[k, c] for x in {a, b}; a null gradient (or partial) is skipped.
template <typename G>
__global__ void __launch_bounds__(kFinalizeWarps* kWarpSize)
    column_finalize_kernel(G* grad_a, G* grad_b, const float* partial_a, const float* partial_b, int chunks, int C) {
  __shared__ float warp_sums[kFinalizeWarps][kWarpSize];
  if (grad_a && partial_a) finalize_columns(grad_a, partial_a, chunks, C, warp_sums);
  if (grad_b && partial_b) finalize_columns(grad_b, partial_b, chunks, C, warp_sums);
}

// Launches column_finalize_kernel over C channels (the one entry point: callers never pick its
// grid, so the kernel's shape can change in one place).
template <typename G>
void launch_column_finalize(G* grad_a, G* grad_b, const float* partial_a, const float* partial_b, int chunks, int C,
                            cudaStream_t stream) {
  if (C <= 0) return;
  column_finalize_kernel<G><<<ceil_div(C, kWarpSize), kFinalizeWarps * kWarpSize, 0, stream>>>(
      grad_a, grad_b, partial_a, partial_b, chunks, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pt::gpu
