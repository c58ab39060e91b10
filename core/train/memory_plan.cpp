#include "core/train/memory_plan.h"

#include <algorithm>
#include <cstdio>

namespace pt {

size_t MemoryPlan::total() const {
  return params + params_working + grads + grads_working + master + optimizer + activations;
}

namespace {

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  return buf;
}

// The layers ZeRO-2/3 hold in full at once at the peak: the embeddings' bucket (layer
// first_layer) plus the largest other one.
size_t peak_working_elements(const ShardLayout& layout) {
  const Bucket& embeddings = layout.bucket_of_layer(layout.first_layer());
  size_t largest_other = 0;
  for (const auto& b : layout.buckets())
    if (&b != &embeddings) largest_other = std::max(largest_other, b.padded);
  return embeddings.padded + largest_other;
}

}  // namespace

MemoryPlan plan_memory(const ShardLayout& layout, DType compute, size_t activation_bytes) {
  MemoryPlan p;
  p.zero_stage = layout.zero_stage();
  p.shard_count = layout.shard_count();
  const size_t c = dtype_size(compute), f = sizeof(float);
  const size_t arena = layout.arena_numel(), shard = layout.shard_numel();
  const size_t working = peak_working_elements(layout);
  const bool f32_compute = compute == DType::f32;
  switch (layout.zero_stage()) {
    case 0:
      p.params = c * arena;
      p.grads = f * arena;
      p.master = f32_compute ? 0 : f * arena;
      break;
    case 1:
      p.params = c * arena;
      p.grads = f * (arena + shard);
      p.master = f * shard;
      break;
    case 2:
      p.params = c * arena;
      p.grads = f * shard;
      p.master = f * shard;
      break;
    default:  // 3
      p.params = f32_compute ? 0 : c * shard;
      p.params_working = c * working;
      p.grads = f * shard;
      p.master = f * shard;
      break;
  }
  if (layout.zero_stage() >= 2) {
    size_t largest_piece = 0;
    for (const auto& b : layout.buckets()) largest_piece = std::max(largest_piece, layout.piece_numel(b));
    p.grads_working = f * (working + largest_piece);
  }
  p.optimizer = 2 * f * shard;
  p.activations = activation_bytes;
  return p;
}

std::string MemoryPlan::describe() const {
  std::string s = "ZeRO-" + std::to_string(zero_stage);
  if (zero_stage > 0) s += " over " + std::to_string(shard_count) + (shard_count == 1 ? " shard" : " shards");
  s += ": params " + mib(params + params_working);
  if (zero_stage == 3)
    s += std::string(params == 0 ? " (the shard is the master;" : " (shard +") + " layers gathered for use: " +
         mib(params_working) + ")";
  s += ", grads " + mib(grads + grads_working);
  if (zero_stage == 1) s += " (full + reduced shard)";
  if (zero_stage >= 2) s += " (shard + per-layer buffers: " + mib(grads_working) + ")";
  s += ", master " + (master == 0 ? std::string("(= params)") : mib(master));
  s += ", adam " + mib(optimizer) + ", activations " + mib(activations) + "; total " + mib(total());
  return s;
}

size_t gpt2_activation_bytes(const ModelSection& m, int B, int T, DType compute) {
  const size_t N = static_cast<size_t>(B) * T, C = m.d_model, NH = m.n_heads, Vp = m.padded_vocab;
  const size_t L = m.n_layers;
  // Per block: ln1, atty, attproj, res2, ln2, fcproj, res3 (N*C each), qkv (3NC), fch and its
  // GELU (4NC each) in the compute dtype; two LayerNorms' mean and rstd and the attention
  // log-sum-exps in f32.
  const size_t block_act = 18 * N * C, block_f32 = 4 * N + B * NH * static_cast<size_t>(T);
  // Outside the blocks: the embedding output, final LayerNorm and logits; backward scratch
  // (dres, dbtc: NC; dqkv: 3NC; dfch and its GELU input: 4NC each); token ids, targets,
  // positions (i32); final LayerNorm statistics and per-token losses (f32).
  const size_t rest_act = 15 * N * C + N * Vp, rest_f32 = 3 * N, i32 = 2 * N + T;
  return dtype_size(compute) * (L * block_act + rest_act) + sizeof(float) * (L * block_f32 + rest_f32) +
         dtype_size(DType::i32) * i32;
}

}  // namespace pt
