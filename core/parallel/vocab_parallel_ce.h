// Vocab-parallel softmax cross-entropy (Megatron's): each tensor-parallel rank holds the logits of
// its vocabulary shard, [N, Vp/tp] for global columns [rank*Vp/tp, (rank+1)*Vp/tp), and the full
// [N, Vp] logits are never assembled. Each rank reduces its shard to per-row (max, sum of exp,
// target logit) (Ops::cross_entropy_shard_stats); the group all-gathers those N*3 floats per rank
// and every rank combines them in rank order (Ops::cross_entropy_shard_finish), which is the
// max / sum reduction across tp, done locally so that every rank gets bitwise the same loss.
// Padded columns (global index >= V) are never predicted, including a shard that is all padding
// or that straddles V.
//
// Communication: one all-gather of 12*N bytes per rank (vs 4*N*Vp for gathering the logits).
#pragma once
#include "core/dist/comm.h"
#include "core/ops/ops.h"

namespace pt {

class VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy(Ops& ops, Comm& tp) : ops_(ops), tp_(tp) {}
  ~VocabParallelCrossEntropy();
  // Bytes of its buffers once it has run over N tokens with tp shards: this rank's stats [N, 3]
  // and every rank's [tp, N, 3] (f32), grown on first use; the memory plan counts them.
  static size_t scratch_bytes(int tp, size_t N) { return tp > 1 ? 3 * N * (1 + size_t(tp)) * sizeof(float) : 0; }
  VocabParallelCrossEntropy(const VocabParallelCrossEntropy&) = delete;
  VocabParallelCrossEntropy& operator=(const VocabParallelCrossEntropy&) = delete;

  // The contract of Ops::softmax_cross_entropy on a shard: losses [N] (f32, the same on every
  // rank), logits [N, Vp_local] (this rank's shard; overwritten with dlogits when dloss != 0),
  // targets [N] global ids (< 0: no target), V the real vocabulary size.
  void forward_backward(Tensor losses, Tensor logits, Tensor targets, int N, int V, int Vp_local, float dloss);

 private:
  Ops& ops_;
  Comm& tp_;
  Tensor stats_, all_stats_;  // grown on demand, reused across calls
};

}  // namespace pt
