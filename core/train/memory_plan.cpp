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

size_t gpt2_activation_bytes(const ModelSection& m, int B, int T, DType compute, const StageLayers& layers,
                             StageSlots slots, Recompute recompute) {
  const size_t N = static_cast<size_t>(B) * T, NC = N * m.d_model, Vp = m.padded_vocab;
  const size_t lse = static_cast<size_t>(B) * m.n_heads * T, L = static_cast<size_t>(layers.layers());
  // f32 per LayerNorm: mean and rstd (N each); the attention keeps its log-sum-exps.
  const size_t stats_f32 = 4 * N + lse;
  // Per block and slot, what the mode keeps (in units of N*C of the compute dtype): none: ln1,
  // atty, ln2 (1 each), qkv (3), res2 (1), fch and fch_gelu (4 each) = 15, and the LayerNorm
  // statistics and log-sum-exps in f32; selective: qkv, res2, fch = 8; full: nothing. Every
  // block but the chunk's last also keeps its output (the next block's input): 1.
  size_t kept_nc = 0, kept_f32 = 0;
  if (recompute == Recompute::none) kept_nc = 15, kept_f32 = stats_f32;
  if (recompute == Recompute::selective) kept_nc = 8;
  // An activation set also holds the token ids (embedding); an I/O set the input and dres.
  const size_t per_set_act = L * kept_nc * NC + (L - 1) * NC, per_io_act = 2 * NC;
  const size_t per_set_f32 = L * kept_f32, per_set_i32 = layers.embedding ? N : 0;
  // The shared set: the two projections, and what the slots do not keep (selective: ln1, atty,
  // ln2, fch_gelu = 7 + statistics; full: everything = 15 + statistics), the stage's output,
  // and the backward scratch (dbtc 1, dqkv 3, dfch and its GELU input 4 each = 12).
  size_t shared_nc = 2 + 1 + 12, shared_f32 = 0;
  if (recompute == Recompute::selective) shared_nc += 7, shared_f32 += stats_f32;
  if (recompute == Recompute::full) shared_nc += 15, shared_f32 += stats_f32;
  size_t shared_act = shared_nc * NC, shared_i32 = 0;
  if (layers.embedding) shared_i32 += T;  // positions
  if (layers.head) {  // targets; final LayerNorm and its statistics; logits; per-token losses
    shared_i32 += N;
    shared_act += NC + N * Vp;
    shared_f32 += 3 * N;
  }
  const size_t S = static_cast<size_t>(slots.activations), IO = static_cast<size_t>(slots.io);
  return dtype_size(compute) * (S * per_set_act + IO * per_io_act + shared_act) +
         sizeof(float) * (S * per_set_f32 + shared_f32) + dtype_size(DType::i32) * (S * per_set_i32 + shared_i32);
}

size_t gpt2_activation_bytes(const ModelSection& m, int B, int T, DType compute) {
  return gpt2_activation_bytes(m, B, T, compute, whole_model_layers(m), StageSlots{}, Recompute::none);
}

}  // namespace pt
