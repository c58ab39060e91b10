// The warp-per-row loop of attention's row kernels (the D = dout . out row dot in
// attention_tiled.cu, the log-sum-exp merges in attention_block.cu), written once. Device code only.
//
// for_each_head_row visits every (b, t, h) row of a [B, T, NH * HS] activation, one warp per row,
// grid-stride, and calls fn(off, li, lane): off = (b T + t) NH HS + h HS, the row's first element
// there, and li = (b NH + h) T + t, its index in a [B, NH, T] array (lse, D). The warp's lanes
// all take the same row, so a branch on the row's values is uniform across the warp.
#pragma once
#include <cstddef>

#include "cuda/cuda_common.h"

namespace pt::gpu {

template <typename Fn>
__device__ __forceinline__ void for_each_head_row(int B, int T, int NH, int HS, Fn&& fn) {
  const size_t rows = static_cast<size_t>(B) * T * NH;
  const size_t warps = static_cast<size_t>(gridDim.x) * (blockDim.x / kWarpSize);
  const int lane = threadIdx.x % kWarpSize;
  for (size_t r = static_cast<size_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; r < rows;
       r += warps) {
    const size_t bt = r / NH;  // b * T + t
    const int h = static_cast<int>(r % NH);
    const size_t b = bt / T, t = bt % T;
    fn(bt * (static_cast<size_t>(NH) * HS) + static_cast<size_t>(h) * HS, (b * NH + h) * T + t, lane);
  }
}

}  // namespace pt::gpu
