// Parallel loop shapes shared by the CpuOps files. The rule they keep: the split of the work
// into items is fixed by the problem size alone (never by the thread count), and each output
// element is written by exactly one item in a fixed order, so results are bitwise identical
// with 1, 2 or 64 threads and no atomics are needed.
#pragma once
#include <algorithm>

namespace pt::cpu {

// Channels per work item of a column-wise reduction over rows (a bias or LayerNorm weight
// gradient, an embedding scatter-add): a whole 64-byte cache line per row, and C/16 items
// (48 at GPT-2 small) to spread over the threads.
constexpr int kChannelBlock = 16;

// Calls f(c0, c1) for the channel ranges [c0, c1) covering [0, C), in parallel.
template <class F>
void for_each_channel_block(int C, F f) {
  int blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; blk++) {
    int c0 = blk * kChannelBlock;
    f(c0, std::min(c0 + kChannelBlock, C));
  }
}

}  // namespace pt::cpu
