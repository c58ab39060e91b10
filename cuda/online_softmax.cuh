// The online softmax state of one row of logits and its deterministic block merge, shared by
// the full-vocabulary cross-entropy (cross_entropy.cu) and the vocab-parallel shard statistics
// (cross_entropy_shard.cu). Device code only.
//
// State: the maximum m seen and s = sum exp(x - m) over what was seen; a new maximum rescales s.
// The block merge is a fixed tree (warp butterflies, then thread 0 over the warps in order), so
// the result is bitwise the same on every run.
#pragma once
#include <cmath>

#include "cuda/cuda_common.h"

namespace pt::gpu {

struct MaxSum {
  float m, s;
};

// Merges two states. A side that has seen nothing has m = -inf and s = 0: the guard keeps
// exp(-inf - (-inf)) = NaN out when both sides are empty.
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ void add_value(MaxSum& st, float x) {
  if (x > st.m) {
    st.s = st.s * expf(st.m - x) + 1.0f;  // st.m = -inf gives 0 * 0 + 1
    st.m = x;
  } else if (x != -INFINITY) {
    // A NaN logit makes the sum (and so the loss) NaN, as it should. A -inf logit adds 0, and
    // is skipped explicitly: while st.m is still -inf, exp(-inf - (-inf)) would be NaN, where
    // CpuOps (max first, then sum) gives exp(-inf - M) = 0.
    st.s += expf(x - st.m);
  }
}

// Merges every thread's state of a block of kBlock threads; the total is valid in thread 0
// only. warp_states: __shared__ room for kBlock / kWarpSize states. Every thread must call it.
template <int kBlock>
__device__ __forceinline__ MaxSum block_merge(MaxSum st, MaxSum* warp_states) {
  static_assert(kBlock % kWarpSize == 0 && kBlock <= 1024, "block_merge: whole warps, at most 1024 threads");
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, st.m, offset), __shfl_xor_sync(0xffffffffu, st.s, offset)};
    st = merge(st, other);
  }
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) warp_states[warp] = st;
  __syncthreads();
  MaxSum total = warp_states[0];
  if (threadIdx.x == 0)
    for (int w = 1; w < kBlock / kWarpSize; ++w) total = merge(total, warp_states[w]);
  return total;
}

}  // namespace pt::gpu
