// Vocab-parallel softmax + cross-entropy, the per-shard halves (Ops::cross_entropy_shard_*; the
// oracle is core/cpu/cpu_loss_shard.cpp). A shard's logits [N, Vl] are global columns
// vocab_start.. of which the first `valid` = clamp(V - vocab_start, 0, Vl) are real.
//   stats:  per row, over the real columns: m = max, s = sum exp(x - m), t = x[target] if the
//           target is in this shard (else 0)  ->  stats[n] = (m, s, t)
//   finish: from all shards' stats [shards, N, 3]: M = max m_r, S = sum_r s_r exp(m_r - M) (in
//           shard order), loss = log S + M - sum t_r; dloss != 0: x <- (exp(x - M)/S - [i == y]) * dloss
//           on real columns, 0 on padding and on rows without a target.
// Algorithm: one block of 256 threads per row; stats keeps an online (max, sum) per thread and
// merges them in a fixed tree (deterministic; online_softmax.cuh, shared with cross_entropy.cu);
// finish reads the shards' stats in order (every thread the same, no reduction) and rewrites the
// row. Scalar loads: a shard's row is Vp/tp wide, which need not keep 16-byte alignment.
// Memory traffic per row (s bytes per logit): stats reads Vl*s, finish reads and writes Vl*s
// (training): the full op's traffic split over the shards, plus 12 * shards bytes of stats.
#include <cmath>

#include "cuda/cross_entropy.h"
#include "cuda/cuda_common.h"
#include "cuda/online_softmax.cuh"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;

template <typename T>
__global__ void __launch_bounds__(kBlock)
    shard_stats_kernel(float* stats, const T* logits, const int32_t* targets, int Vl, int valid, int vocab_start) {
  __shared__ MaxSum warp_states[kBlock / kWarpSize];
  const int row = blockIdx.x;
  const T* x = logits + static_cast<size_t>(row) * Vl;
  MaxSum st{-INFINITY, 0.0f};
  for (int i = threadIdx.x; i < valid; i += kBlock) add_value(st, to_float(x[i]));
  const MaxSum total = block_merge<kBlock>(st, warp_states);
  if (threadIdx.x == 0) {
    const int target = targets[row], local = target - vocab_start;
    float* out = stats + static_cast<size_t>(row) * 3;
    out[0] = total.m;
    out[1] = total.s;
    out[2] = (target >= 0 && local >= 0 && local < valid) ? to_float(x[local]) : 0.0f;
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlock)
    shard_finish_kernel(float* losses, T* logits, const int32_t* targets, const float* all_stats, int shards, int N,
                        int Vl, int valid, int vocab_start, float dloss) {
  const int row = blockIdx.x;
  T* x = logits + static_cast<size_t>(row) * Vl;
  const int target = targets[row];
  const bool backward = dloss != 0.0f;
  if (target < 0) {
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (backward)
      for (int i = threadIdx.x; i < Vl; i += kBlock) x[i] = from_float<T>(0.0f);
    return;
  }
  float M = -INFINITY;
  for (int r = 0; r < shards; ++r) M = fmaxf(M, all_stats[(static_cast<size_t>(r) * N + row) * 3]);
  float S = 0.0f, target_logit = 0.0f;
  for (int r = 0; r < shards; ++r) {
    const float* st = all_stats + (static_cast<size_t>(r) * N + row) * 3;
    if (st[0] != -INFINITY) S += st[1] * expf(st[0] - M);
    target_logit += st[2];
  }
  if (threadIdx.x == 0) losses[row] = logf(S) + M - target_logit;
  if (!backward) return;
  const float scale = dloss / S;
  const int local = target - vocab_start;
  for (int i = threadIdx.x; i < Vl; i += kBlock) {
    float d = 0.0f;  // padded columns
    if (i < valid) {
      d = expf(to_float(x[i]) - M) * scale;
      if (i == local) d -= dloss;
    }
    x[i] = from_float<T>(d);
  }
}

int real_columns(int Vl, int V, int vocab_start) {
  const long long v = static_cast<long long>(V) - vocab_start;
  return static_cast<int>(v < 0 ? 0 : (v > Vl ? Vl : v));
}

}  // namespace

void cross_entropy_shard_stats(DType dtype, float* stats, const void* logits, const int32_t* targets, int N, int Vl,
                               int V, int vocab_start, void* stream) {
  if (N <= 0) return;
  const int valid = real_columns(Vl, V, vocab_start);
  dispatch_act("cross_entropy_shard_stats", dtype, [&](auto tag) {
    using E = decltype(tag);
    shard_stats_kernel<E>
        <<<N, kBlock, 0, as_stream(stream)>>>(stats, static_cast<const E*>(logits), targets, Vl, valid, vocab_start);
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_shard_finish(DType dtype, float* losses, void* logits, const int32_t* targets,
                                const float* all_stats, int shards, int N, int Vl, int V, int vocab_start, float dloss,
                                void* stream) {
  if (N <= 0) return;
  const int valid = real_columns(Vl, V, vocab_start);
  dispatch_act("cross_entropy_shard_finish", dtype, [&](auto tag) {
    using E = decltype(tag);
    shard_finish_kernel<E><<<N, kBlock, 0, as_stream(stream)>>>(losses, static_cast<E*>(logits), targets, all_stats,
                                                                shards, N, Vl, valid, vocab_start, dloss);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace pt::gpu
