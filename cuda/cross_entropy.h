// Host launcher for the fused softmax + cross-entropy (cuda/cross_entropy.cu). Same
// conventions as the other launchers.
#pragma once
#include <cstdint>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// Per row n < N of logits[N, Vp] (dtype f32 or bf16), over the first V columns:
//   losses[n] = logsumexp(logits[n, :V]) - logits[n, targets[n]]   (f32; 0 when targets[n] < 0)
// and when dloss != 0 the row is overwritten IN PLACE with (softmax - onehot) * dloss, the
// padded columns [V, Vp) and rows without a target with 0. dloss == 0 leaves logits untouched.
// A target >= V (a data bug the host cannot see without a sync) gives a NaN loss.
void softmax_cross_entropy(DType dtype, float* losses, void* logits, const int32_t* targets, int N, int V, int Vp,
                           float dloss, void* stream = nullptr);

// Vocab-parallel halves (cross_entropy_shard.cu), see Ops::cross_entropy_shard_stats/finish:
// stats [N, 3] f32 from a shard logits [N, Vl] holding global columns vocab_start..; finish from
// all shards' stats [shards, N, 3]. A target >= V gives a NaN loss (the host check is CpuOps's).
void cross_entropy_shard_stats(DType dtype, float* stats, const void* logits, const int32_t* targets, int N, int Vl,
                               int V, int vocab_start, void* stream = nullptr);
void cross_entropy_shard_finish(DType dtype, float* losses, void* logits, const int32_t* targets,
                                const float* all_stats, int shards, int N, int Vl, int V, int vocab_start, float dloss,
                                void* stream = nullptr);

}  // namespace pt::gpu
