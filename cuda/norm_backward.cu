// The backward of LayerNorm (layernorm.cu) and RMSNorm (rmsnorm.cu) in one pass over the rows:
// the input gradient and the weight (and bias) gradients from one read of x and dout.
//
// Computes, ACCUMULATING (the Ops convention), with g = w * dout and
//   LayerNorm: xhat = (x - mean) * rstd,  dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),
//              dw += sum_n xhat * dout,   db += sum_n dout
//   RMSNorm:   xhat = x * rstd,           dinp += rstd * (g - xhat * mean_c(g * xhat)),
//              dw += sum_n xhat * dout
// mean and rstd are the forward's fp32 statistics; storage in the dtype, all math in fp32.
//
// Algorithm: one kernel over the rows, then the column finalize of column_reduce.cuh.
//  - Block b (4 warps) owns rows [b*R, b*R + R), R fixed by N alone (NormSplit: ~2048 blocks,
//    R >= 8); warp w takes rows b*R + w, + w + 4, ... One warp per row, as the forward: lane l handles the 16-byte
//    chunks l, l + 32, ... of the row.
//  - Pass 1 over a row reads x and dout once. It adds xhat * dout (and dout) for each of the
//    lane's channels into the warp's own fp32 accumulators in shared memory (no other thread
//    touches them: no atomics), and sums g and g * xhat for the row's two means (warp
//    butterfly). Pass 2 re-reads the same bytes (the same thread just read them: L1/L2 hits, not
//    DRAM) with dinp and writes dinp.
//  - At the end the block adds its 4 warps' accumulators in warp order and writes one fp32
//    partial per channel (and block); launch_column_finalize sums the blocks' partials in a fixed
//    order into dw/db. Every sum has an order fixed by N and C: bitwise the same on every run and
//    every GPU.
//  Shared memory: 4 warps x Cp x 4 bytes per accumulated gradient (Cp = C rounded up to a whole
//  number of 32 x VEC chunks), laid out [chunk round][element][lane] so that a warp's 32
//  accesses fall in 32 banks. Wider rows run with fewer warps per block (the same split, the
//  same order), down to one: up to C = 24576 for LayerNorm, twice that for RMSNorm.
//
// Memory traffic, the floor the kernel should approach (s = activation bytes):
//   read x, dout, dinp + write dinp = 4*N*C*s, + 8N (statistics), + the partials (4 or 8 bytes
//   per channel and block, written once and read once: 2 x 8 x C x 2048 bytes, 6% more at
//   GPT-2 124M's B 64 x T 1024).
// GPT-2 124M at B*T = 65536, C = 768, bf16: 403 MB, ~100 us at 4.2 TB/s (H200); the former
// two-kernel form read x and dout twice (6*N*C*s) with a column walk of 64-byte segments.
// The arithmetic (~12 flops per element) is far below the FLOP floor.
#include <algorithm>

#include "cuda/column_reduce.cuh"
#include "cuda/cuda_common.h"
#include "cuda/norm_args.h"
#include "cuda/norm_backward.h"

namespace pt::gpu {

namespace {

constexpr int kMaxWarps = 4;
constexpr int kGroup = 2;  // a row's chunks loaded together by each lane in pass 1 (4 costs 148 registers)
// The accumulators' shared-memory budget per block. Fixed (not the device's limit), because the
// warps per block set the summation order; 96 KB fits every sm_80+ part (sm_86/89 allow 99 KB).
constexpr int kMaxSharedBytes = 96 * 1024;

// How the rows split into blocks: R rows per block, from N alone, so the summation order of
// the weight gradients never depends on the device. About 2048 blocks at training shapes, at
// least 8 rows a block (2 per warp). Measured on an H200 (2026-11-27), 512 blocks of 128 rows
// ran at 36% of the copy bandwidth: 1.3 waves of 3 blocks per SM, each warp's 32 rows one
// after another (a row's two passes are a chain of load latencies); 2048 blocks are 3 waves
// of 5 per SM with 8 rows a warp, for 6% more bytes in partials (C x 8 bytes a block).
struct NormSplit {
  int rows_per_block, blocks;
  explicit NormSplit(int N) {
    rows_per_block = std::clamp(ceil_div(N, 2048), 8, 256);
    blocks = ceil_div(N, rows_per_block);
  }
};

// Channels one warp's accumulator covers: C rounded up to whole rounds of 32 lanes x VEC.
__host__ __device__ int padded_channels(int C, int vec) { return ceil_div(C, kWarpSize * vec) * kWarpSize * vec; }

// Accumulator index of element k of the lane's chunk in round j (channel (j*32 + lane)*VEC + k).
template <int VEC>
__device__ __forceinline__ int acc_index(int j, int k, int lane) {
  return (j * VEC + k) * kWarpSize + lane;
}

template <typename T, int VEC, bool kLayerNorm>
__global__ void __launch_bounds__(kMaxWarps* kWarpSize, 5)  // 5 blocks (20 warps) an SM: <= 102 registers
    norm_backward_kernel(T* __restrict__ dinp, float* __restrict__ partial_w, float* __restrict__ partial_b,
                         const T* __restrict__ dout, const T* __restrict__ inp, const T* __restrict__ w,
                         const float* __restrict__ mean, const float* __restrict__ rstd, int N, int C,
                         int rows_per_block) {
  // [warps][Cp] for dw when wanted, then [warps][Cp] for db when wanted (LayerNorm only)
  extern __shared__ float acc[];
  const int warps = blockDim.x / kWarpSize;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int Cp = padded_channels(C, VEC);
  const bool want_w = partial_w != nullptr, want_b = kLayerNorm && partial_b != nullptr;
  const int b_base = want_w ? warps : 0;  // the first db accumulator
  float* acc_w = acc + warp * Cp;
  float* acc_b = acc + (b_base + warp) * Cp;
  for (int i = threadIdx.x; i < (b_base + (want_b ? warps : 0)) * Cp; i += blockDim.x) acc[i] = 0.0f;
  __syncthreads();

  const int r0 = blockIdx.x * rows_per_block, r1 = min(N, r0 + rows_per_block);
  for (int row = r0 + warp; row < r1; row += warps) {
    const size_t offset = static_cast<size_t>(row) * C;
    const float m = kLayerNorm ? mean[row] : 0.0f;  // x - 0 is exactly x: RMSNorm's xhat = x * rstd
    const float r = rstd[row];
    float g_sum = 0.0f, gx_sum = 0.0f;
    // kGroup chunks at a time, every load issued before the math that uses them, so a warp has
    // kGroup x 32 B (x and dout) per lane in flight rather than one chunk's.
    for (int j0 = 0; j0 * kWarpSize * VEC < C; j0 += kGroup) {
      Packed<T, VEC> x[kGroup], dy[kGroup], wv[kGroup];
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        const int i = ((j0 + u) * kWarpSize + lane) * VEC;
        if (i < C) {
          x[u] = load_packed<T, VEC>(inp + offset + i);
          dy[u] = load_packed<T, VEC>(dout + offset + i);
          if (dinp) wv[u] = load_packed<T, VEC>(w + i);  // w only for dinp (it may be null)
        }
      }
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        const int j = j0 + u;
        if ((j * kWarpSize + lane) * VEC >= C) continue;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = to_float(dy[u].v[k]);
          const float xhat = (to_float(x[u].v[k]) - m) * r;
          if (want_w) acc_w[acc_index<VEC>(j, k, lane)] += xhat * d;
          if (want_b) acc_b[acc_index<VEC>(j, k, lane)] += d;
          if (dinp) {
            const float g = to_float(wv[u].v[k]) * d;
            g_sum += g;
            gx_sum += g * xhat;
          }
        }
      }
    }
    if (!dinp) continue;
    const float g_mean = kLayerNorm ? warp_sum(g_sum) / C : 0.0f;
    const float gx_mean = warp_sum(gx_sum) / C;
#pragma unroll 1  // L1/L2 hits; unrolled, the loop's registers cost occupancy
    for (int i = lane * VEC; i < C; i += kWarpSize * VEC) {
      const Packed<T, VEC> x = load_packed<T, VEC>(inp + offset + i);
      const Packed<T, VEC> dy = load_packed<T, VEC>(dout + offset + i);
      const Packed<T, VEC> wv = load_packed<T, VEC>(w + i);
      Packed<T, VEC> dx = load_packed<T, VEC>(dinp + offset + i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float xhat = (to_float(x.v[k]) - m) * r;
        const float g = to_float(wv.v[k]) * to_float(dy.v[k]);
        dx.v[k] = from_float<T>(to_float(dx.v[k]) + r * (g - g_mean - xhat * gx_mean));
      }
      store_packed<T, VEC>(dinp + offset + i, dx);
    }
  }
  if (!want_w && !want_b) return;

  // The block's partial per channel: its warps' accumulators added in warp order.
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int chunk = c / VEC;
    const int idx = acc_index<VEC>(chunk / kWarpSize, c % VEC, chunk % kWarpSize);
    const size_t out = static_cast<size_t>(blockIdx.x) * C + c;
    if (want_w) {
      float s = 0.0f;
      for (int v = 0; v < warps; ++v) s += acc[v * Cp + idx];
      partial_w[out] = s;
    }
    if (want_b) {
      float s = 0.0f;
      for (int v = 0; v < warps; ++v) s += acc[(b_base + v) * Cp + idx];
      partial_b[out] = s;
    }
  }
}

// Warps per block for rows of C channels with `sums` accumulated gradients: as many as fit in
// kMaxSharedBytes, at most kMaxWarps; 0 when not even one warp's accumulators fit.
int warps_for(int C, int vec, int sums) {
  if (sums == 0) return kMaxWarps;
  const size_t per_warp = size_t(padded_channels(C, vec)) * sizeof(float) * sums;
  return static_cast<int>(std::min<size_t>(kMaxWarps, kMaxSharedBytes / per_warp));
}

// One launch of norm_backward_kernel: `warps` warps a block, `sums` accumulated gradients.
template <typename T, int VEC, bool kLayerNorm>
void launch_rows(const char* op, const NormSplit& split, int warps, int sums, T* dinp, float* partial_w,
                 float* partial_b, const T* dout, const T* inp, const T* w, const float* mean, const float* rstd, int N,
                 int C, cudaStream_t stream) {
  const size_t smem = size_t(warps) * padded_channels(C, VEC) * sizeof(float) * sums;
  auto kernel = norm_backward_kernel<T, VEC, kLayerNorm>;
  use_dynamic_shared(kernel, smem, [&] { return op; });
  kernel<<<split.blocks, warps * kWarpSize, smem, stream>>>(dinp, partial_w, partial_b, dout, inp, w, mean, rstd, N, C,
                                                            split.rows_per_block);
  CUDA_CHECK_LAUNCH();
}

// The one launcher of both norms' backward. mean == nullptr for RMSNorm (which has no db).
void norm_backward(const char* op, bool layernorm, DType dtype, DType grad_dtype, void* dinp, void* dw, void* db,
                   const void* dout, const void* inp, const void* w, const float* mean, const float* rstd, int N,
                   int C, void* scratch, void* stream) {
  if (N == 0 || (!dinp && !dw && !db)) return;
  // Everything is checked before the first launch, so that a refused call has written nothing.
  check(dinp == nullptr || w != nullptr, std::string(op) + ": w is null");
  const bool grads = dw || db;
  if (grads) {
    check(scratch != nullptr, std::string(op) + ": scratch is null");
    check_act_grad(op, dtype, grad_dtype);
  }
  cudaStream_t s = as_stream(stream);
  const NormSplit split(N);
  const int sums = (dw ? 1 : 0) + (db ? 1 : 0);
  // The blocks' partial sums of dw (pw) and db (pb), [blocks][C] each, in scratch.
  float* pw = dw ? static_cast<float*>(scratch) : nullptr;
  float* pb = db ? static_cast<float*>(scratch) + size_t(split.blocks) * C : nullptr;
  dispatch_act(op, dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const bool vec = vec16_ok<T>(C, {dout, inp}) && (dinp == nullptr || vec16_ok<T>(C, {dinp, w}));
    const int warps = warps_for(C, vec ? V : 1, sums);
    check(warps > 0, std::string(op) + ": C=" + std::to_string(C) +
                         " channels are too many for the weight-gradient accumulators in shared memory");
    T* d = static_cast<T*>(dinp);
    const T* dy = static_cast<const T*>(dout);
    const T* x = static_cast<const T*>(inp);
    const T* wt = static_cast<const T*>(w);
    // RMSNorm comes with no db (pb null) and no mean.
    if (layernorm) {
      if (vec) launch_rows<T, V, true>(op, split, warps, sums, d, pw, pb, dy, x, wt, mean, rstd, N, C, s);
      else launch_rows<T, 1, true>(op, split, warps, sums, d, pw, pb, dy, x, wt, mean, rstd, N, C, s);
    } else {
      if (vec) launch_rows<T, V, false>(op, split, warps, sums, d, pw, pb, dy, x, wt, mean, rstd, N, C, s);
      else launch_rows<T, 1, false>(op, split, warps, sums, d, pw, pb, dy, x, wt, mean, rstd, N, C, s);
    }
  });
  if (grads) {
    dispatch_act_grad(op, dtype, grad_dtype, [&](auto, auto grad) {
      using G = decltype(grad);
      launch_column_finalize<G>(static_cast<G*>(dw), static_cast<G*>(db), pw, pb, split.blocks, C, s);
    });
  }
}

}  // namespace

size_t layernorm_backward_scratch_bytes(int N, int C) { return size_t(NormSplit(N).blocks) * C * 2 * sizeof(float); }

size_t rmsnorm_backward_scratch_bytes(int N, int C) { return size_t(NormSplit(N).blocks) * C * sizeof(float); }

void layernorm_backward(DType dtype, DType grad_dtype, void* dinp, void* dw, void* db, const void* dout,
                        const void* inp, const void* w, const float* mean, const float* rstd, int N, int C,
                        void* scratch, void* stream) {
  check_norm_args("layernorm_backward", N, C, {dout, inp, mean, rstd});
  norm_backward("layernorm_backward", true, dtype, grad_dtype, dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch,
                stream);
}

void rmsnorm_backward(DType dtype, DType grad_dtype, void* dinp, void* dw, const void* dout, const void* inp,
                      const void* w, const float* rstd, int N, int C, void* scratch, void* stream) {
  check_norm_args("rmsnorm_backward", N, C, {dout, inp, rstd});
  norm_backward("rmsnorm_backward", false, dtype, grad_dtype, dinp, dw, nullptr, dout, inp, w, nullptr, rstd, N, C,
                scratch, stream);
}

}  // namespace pt::gpu
