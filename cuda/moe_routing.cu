// The mixture-of-experts routing plan and the load-balancing loss, on the device, so that a
// sparse block never waits for the host (the contracts are Ops', core/ops/ops.h; CpuOps's
// moe_route, moe_balance_sums and moe_balance_loss are the reference).
//
// Computes:
//   route:        offsets[e] = #{i : topk_expert[i] < e} over the N k choices (ids in [0, E)),
//                 offsets[E] = every valid choice, and slot_of[i] = offsets[e] + #{i' < i : topk_expert[i'] = e}
//                 for e = topk_expert[i] (a stable counting sort: (token, choice) order within
//                 an expert); slot_of[i] = -1 for an id outside [0, E).
//   balance sums: sums[e] = offsets[e + 1] - offsets[e], sums[E + e] = sum_n probs[n, e], sums[2E] = N.
//   balance loss: tokens = sums[2E], f_e = sums[e] / tokens, P_e = sums[E + e] / tokens,
//                 dprobs_all[e] = aux_weight E f_e / tokens, stats += (E sum_e f_e P_e, max_e f_e E / k).
//
// How:
//  - route: one block per expert e reads all N k ids twice: once to count the ids below e (its
//    offset), once in chunks of 4096 in order, 16 consecutive ids a thread, where a scan of the
//    threads' counts (warp shuffles, then the block's 8 warp totals) gives each of e's choices
//    its rank: two barriers a chunk, so N k = 32k ids take 8 chunks. Each slot is written by exactly one block (block 0
//    also writes the -1s); no atomics, so the same ids give the same plan on every run.
//  - balance sums: one block per expert sums its probs column in a fixed order (per-thread
//    strided sums, then a fixed tree), fp32.
//  - balance loss: one warp; lane 0 sums aux and finds the busiest expert in expert order
//    (double, as the CPU), every lane writes dprobs_all.
//
// Memory traffic: route reads 8 N k E bytes through L2 (E blocks x two passes over the 4 N k
// bytes of ids; at N k = 16k and E = 64 about 8 MB, a few microseconds) and writes 4 N k; the
// sums read 4 N E bytes (the probs, columns strided by E, from L2). Latency-bound, a few launches
// of microseconds each, against the host round trip they replace (two synchronising copies).
#include <cstdint>

#include "cuda/cuda_common.h"
#include "cuda/moe.h"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;
constexpr int kWarps = kBlock / kWarpSize;
constexpr int kPerThread = 16;                  // route: consecutive ids per thread and chunk
constexpr int kChunk = kBlock * kPerThread;     // route: ids per chunk

// The sum of v over the block, returned to every thread (fixed order: deterministic).
template <typename T>
__device__ T block_sum(T v, T* scratch /* kWarps */) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  return total;
}

__global__ void __launch_bounds__(kBlock) moe_route_kernel(int32_t* slot_of, int32_t* offsets,
                                                           const int32_t* topk_expert, int NK, int E) {
  __shared__ int scratch[kWarps];
  const int e = static_cast<int>(blockIdx.x);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  int below = 0;
  for (int i = static_cast<int>(threadIdx.x); i < NK; i += kBlock) {
    const int x = topk_expert[i];
    below += x >= 0 && x < e;
  }
  const int first = block_sum(below, scratch);
  // In chunks of kChunk ids, in order, each thread taking kPerThread consecutive ones: each of e's
  // ids gets first + e's ids before it (earlier chunks, earlier threads by a block scan, earlier
  // ids of its own thread).
  __shared__ int warp_totals[kWarps];
  int seen = 0;  // e's ids in earlier chunks
  for (int base = 0; base < NK; base += kChunk) {
    const int i0 = base + static_cast<int>(threadIdx.x) * kPerThread;
    int x[kPerThread], mine = 0;
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      x[u] = i0 + u < NK ? topk_expert[i0 + u] : -1;
      mine += x[u] == e;
    }
    int inclusive = mine;  // the warp's inclusive scan of `mine`
#pragma unroll
    for (int offset = 1; offset < kWarpSize; offset *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += v;
    }
    if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
    __syncthreads();
    int before = seen + inclusive - mine, chunk = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      before += w < warp ? warp_totals[w] : 0;
      chunk += warp_totals[w];
    }
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      if (x[u] == e) slot_of[i0 + u] = first + before++;
      if (e == 0 && i0 + u < NK && (x[u] < 0 || x[u] >= E)) slot_of[i0 + u] = -1;
    }
    seen += chunk;
    __syncthreads();  // warp_totals are read before the next chunk writes them
  }
  if (threadIdx.x == 0) {
    offsets[e] = first;
    if (e == E - 1) offsets[E] = first + seen;
  }
}

__global__ void __launch_bounds__(kBlock) moe_balance_sums_kernel(float* sums, const float* probs,
                                                                  const int32_t* offsets, int N, int E) {
  __shared__ float scratch[kWarps];
  const int e = static_cast<int>(blockIdx.x);
  float s = 0.0f;
  for (int n = static_cast<int>(threadIdx.x); n < N; n += kBlock) s += probs[size_t(n) * E + e];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    sums[e] = static_cast<float>(offsets[e + 1] - offsets[e]);
    sums[E + e] = s;
    if (e == 0) sums[2 * E] = static_cast<float>(N);
  }
}

__global__ void moe_balance_loss_kernel(float* dprobs_all, float* stats, const float* sums, int E, int k,
                                        float aux_weight) {
  const double tokens = sums[2 * E];
  for (int e = static_cast<int>(threadIdx.x); e < E; e += kWarpSize)
    dprobs_all[e] = static_cast<float>(aux_weight * E * (sums[e] / tokens) / tokens);
  if (threadIdx.x != 0 || stats == nullptr) return;
  double aux = 0, busiest = 0;
  for (int e = 0; e < E; ++e) {
    const double f = sums[e] / tokens, P = sums[E + e] / tokens;
    aux += E * f * P;
    busiest = f > busiest ? f : busiest;
  }
  stats[0] += static_cast<float>(aux);
  stats[1] += static_cast<float>(busiest * E / k);
}

cudaStream_t as_cuda(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

void moe_route(int32_t* slot_of, int32_t* offsets, const int32_t* topk_expert, int N, int k, int E, void* stream) {
  check(N >= 0 && k >= 1 && E >= 1, "moe_route: bad shape");
  moe_route_kernel<<<E, kBlock, 0, as_cuda(stream)>>>(slot_of, offsets, topk_expert, N * k, E);
  CUDA_CHECK_LAUNCH();
}

void moe_balance_sums(float* sums, const float* probs, const int32_t* offsets, int N, int E, void* stream) {
  check(N >= 0 && E >= 1, "moe_balance_sums: bad shape");
  moe_balance_sums_kernel<<<E, kBlock, 0, as_cuda(stream)>>>(sums, probs, offsets, N, E);
  CUDA_CHECK_LAUNCH();
}

void moe_balance_loss(float* dprobs_all, float* stats, const float* sums, int E, int k, float aux_weight,
                      void* stream) {
  check(E >= 1 && k >= 1, "moe_balance_loss: bad shape");
  moe_balance_loss_kernel<<<1, kWarpSize, 0, as_cuda(stream)>>>(dprobs_all, stats, sums, E, k, aux_weight);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pt::gpu
