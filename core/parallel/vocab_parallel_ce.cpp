#include "core/parallel/vocab_parallel_ce.h"

namespace pt {

VocabParallelCrossEntropy::~VocabParallelCrossEntropy() {
  if (stats_) ops_.release(stats_);
  if (all_stats_) ops_.release(all_stats_);
}

void VocabParallelCrossEntropy::forward_backward(Tensor losses, Tensor logits, Tensor targets, int N, int V,
                                                 int Vp_local, float dloss) {
  const int shards = tp_.size();
  const size_t n = size_t(N) * 3;
  if (stats_.numel < n) {
    if (stats_) ops_.release(stats_);
    if (all_stats_) ops_.release(all_stats_);
    stats_ = ops_.alloc(n, DType::f32);
    all_stats_ = ops_.alloc(n * shards, DType::f32);
  }
  const int vocab_start = tp_.rank() * Vp_local;
  const Tensor mine = stats_.slice(0, n), all = all_stats_.slice(0, n * shards);
  ops_.cross_entropy_shard_stats(mine, logits, targets, N, Vp_local, V, vocab_start);
  tp_.all_gather(mine, all);
  ops_.cross_entropy_shard_finish(losses, logits, targets, all, shards, N, Vp_local, V, vocab_start, dloss);
}

}  // namespace pt
