#include "core/train/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/model/head_chunks.h"
#include "core/model/moe_layer.h"
#include "core/parallel/tensor_parallel.h"
#include "core/parallel/vocab_parallel_ce.h"

namespace pt {

size_t MemoryPlan::total() const {
  return params + params_working + grads + grads_working + master + optimizer + activations;
}

std::string format_mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  return buf;
}

std::string describe_memory_use(const MemoryUse& use, size_t plan_total) {
  std::string s = "allocated " + format_mib(use.live) + ", peak " + format_mib(use.peak) + " (plan " +
                  format_mib(plan_total) + ")";
  if (use.device_total > 0)
    s += "; GPU used " + format_mib(use.device_used) + " of " + format_mib(use.device_total);
  return s;
}

namespace {

// The layers ZeRO-2/3 hold in full at once at the peak: the embeddings' bucket (layer
// first_layer) plus the largest other one.
size_t peak_working_elements(const ShardLayout& layout) {
  const Bucket& embeddings = layout.bucket_of_layer(layout.first_layer());
  size_t largest_other = 0;
  for (const auto& b : layout.buckets())
    if (&b != &embeddings) largest_other = std::max(largest_other, b.padded);
  return embeddings.padded + largest_other;
}

// What one ParamStore over `layout` allocates (everything but activations), with `working`
// elements of layers held in full at the peak by ZeRO-2/3.
MemoryPlan store_memory(const ShardLayout& layout, DType compute, size_t working) {
  MemoryPlan p;
  p.zero_stage = layout.zero_stage();
  p.shard_count = layout.shard_count();
  const size_t c = dtype_size(compute), f = sizeof(float);
  const size_t arena = layout.arena_numel(), shard = layout.shard_numel();
  const bool params_full = layout.params_resident(), grads_full = layout.grads_resident();
  // What ParamStore allocates: the resident arenas, and the shard's buffers except where one
  // shard lets a resident arena serve as them.
  p.params = params_full ? c * arena : compute == DType::f32 ? 0 : c * shard;  // ZeRO-3: the shard, or the master
  p.master = layout.master_is_params(compute) ? 0 : f * shard;
  p.grads = (grads_full ? f * arena : 0) + (layout.grad_shard_is_arena() ? 0 : f * shard);
  // ZeRO-2/3's working buffers (ParamGather, GradSync); with one shard the layers are used in
  // place in the shard, so there are none.
  if (!layout.single_shard()) {
    if (!params_full) p.params_working = c * working;
    if (!grads_full) {
      p.grads_working = f * (working + layout.largest_piece_numel());
    }
  }
  p.optimizer = 2 * f * shard;
  return p;
}

}  // namespace

MemoryPlan plan_memory(const ShardLayout& layout, DType compute, size_t activation_bytes) {
  MemoryPlan p = layout.single_shard() ? store_memory(layout, compute, 0)
                                       : store_memory(layout, compute, peak_working_elements(layout));
  p.activations = activation_bytes;
  return p;
}

void add_expert_memory(MemoryPlan& plan, const ShardLayout& experts, DType compute) {
  // The experts' layers are gathered (ZeRO-3) and their gradients reduced (ZeRO-2/3) one at a time.
  size_t largest = 0;
  for (const auto& b : experts.buckets()) largest = std::max(largest, b.padded);
  const MemoryPlan e = store_memory(experts, compute, largest);
  plan.params += e.params;
  plan.params_working += e.params_working;
  plan.grads += e.grads;
  plan.grads_working += e.grads_working;
  plan.master += e.master;
  plan.optimizer += e.optimizer;
  plan.experts = e.total();
}

std::string MemoryPlan::describe() const {
  std::string s = "ZeRO-" + std::to_string(zero_stage);
  if (zero_stage > 0) s += " over " + std::to_string(shard_count) + (shard_count == 1 ? " shard" : " shards");
  // With one shard every stage holds ZeRO-0's buffers (the shard is the full arena).
  const bool sharded = shard_count > 1;
  s += ": params " + format_mib(params + params_working);
  if (zero_stage == 3 && sharded)
    s += std::string(params == 0 ? " (the shard is the master;" : " (shard +") + " layers gathered for use: " +
         format_mib(params_working) + ")";
  else if (params == 0)
    s += " (= master)";
  s += ", grads " + format_mib(grads + grads_working);
  if (zero_stage == 1 && sharded) s += " (full + reduced shard)";
  if (zero_stage >= 2 && sharded) s += " (shard + per-layer buffers: " + format_mib(grads_working) + ")";
  s += ", master " + (master == 0 ? std::string("(= params)") : format_mib(master));
  s += ", adam " + format_mib(optimizer) + ", activations " + format_mib(activations) + "; total " + format_mib(total());
  if (experts > 0) s += " (of which this rank's routed experts " + format_mib(experts) + ")";
  return s;
}

Fp8Sites fp8_sites(const Fp8Recipe& fp8, const StageLayers& layers, const Architecture& arch) {
  Fp8Sites s;
  s.head = layers.head && fp8.on(Fp8Layer::lm_head);
  if (fp8.on(Fp8Layer::experts))
    for (int l = layers.first_layer; l < layers.end_layer; l++) s.sparse += arch.sparse_block(l) ? 1 : 0;
  s.experts = s.sparse > 0 ? arch.n_experts : 0;
  s.blocks = layers.layers();
  if (!fp8.blocks() && !s.head && s.sparse == 0) return {};  // nothing of this chunk in FP8
  return s;
}

std::vector<Fp8Linear::Shape> fp8_layer_shapes(const StageDims& d, const StageLayers& layers, const Fp8Recipe& fp8,
                                               DType compute) {
  std::vector<Fp8Linear::Shape> shapes;
  const size_t C = static_cast<size_t>(d.C);
  if (layers.layers() > 0) {  // not a stage of the embeddings or the head alone
    if (fp8.on(Fp8Layer::qkv)) shapes.push_back({C, static_cast<size_t>(d.QKVl)});
    if (fp8.on(Fp8Layer::attn_out)) shapes.push_back({static_cast<size_t>(d.Cl), C});
  }
  for (int l = layers.first_layer; l < layers.end_layer; l++) {
    const size_t F = static_cast<size_t>(d.arch.mlp_hidden(l) / d.tp), U = d.arch.up_width(d.arch.mlp_hidden(l)) / d.tp;
    if (F == 0) continue;  // a sparse block without shared experts: no dense MLP
    if (fp8.on(Fp8Layer::mlp_up)) shapes.push_back({C, U});
    if (fp8.on(Fp8Layer::mlp_down)) shapes.push_back({F, C});
  }
  // The LM head's products take one chunk of rows at a time (core/model/head_chunks.h).
  if (layers.head && fp8.on(Fp8Layer::lm_head))
    shapes.push_back({C, static_cast<size_t>(d.Vl), static_cast<size_t>(head_chunk_rows(d.N, d.Vl, compute))});
  return shapes;
}

size_t fp8_scratch_bytes(const StageDims& d, const StageLayers& layers, const Fp8Recipe& fp8, DType compute) {
  const int sites = fp8_sites(fp8, layers, d.arch).count();
  const size_t delayed = fp8.delayed && sites > 0 ? Fp8Delayed::bytes(sites, fp8.amax_history, d.tp, d.dp_cp) : 0;
  return Fp8Linear::scratch_bytes(static_cast<size_t>(d.N), fp8_layer_shapes(d, layers, fp8, compute), d.tp, d.cp,
                                  fp8.rowwise) +
         delayed;
}

size_t decoder_activation_bytes(const StageDims& d, CpImpl cp_impl, DType compute, const StageLayers& layers,
                             StageSlots slots, Recompute recompute, const Fp8Recipe& fp8) {
  // Element counts of one tensor of each shape: the residual stream (rows x C, 1/tp of the
  // tokens under sequence parallel), the attention channels (N x C/tp), the q|k|v projection
  // (N x QKVl), the MLP hidden (N x Fl) and its up-projection (N x Ul: 2 Fl with SwiGLU's gate).
  const size_t N = d.N, rows = d.rows, RC = d.rows_c();
  const size_t AC = N * d.Cl, QKV = N * d.QKVl, FC = N * d.Fl, UC = N * d.Ul, L = static_cast<size_t>(layers.layers());
  // A norm's f32 statistics per row: LayerNorm's mean and rstd, RMSNorm's rstd.
  const size_t stats = d.norm_mean() ? 2 : 1;
  // What selective recompute rebuilds: ln1, ln2 (RC each), atty (AC), the activation's output
  // (FC), and in f32 the norms' statistics and the attention's log-sum-exps. What only full
  // recompute rebuilds, the matmul inputs: qkv (QKV), res2 (RC), fch (UC).
  const size_t rebuilt = 2 * RC + AC + FC, rebuilt_f32 = 2 * stats * rows + d.lse();
  const size_t matmul_in = QKV + RC + UC;
  // Per block and activation set, what the mode keeps; every block but the chunk's last also
  // keeps its output (the next block's input, RC). An I/O set holds the input and dres.
  size_t kept = 0, kept_f32 = 0;
  if (recompute == Recompute::none) kept = rebuilt + matmul_in, kept_f32 = rebuilt_f32;
  if (recompute == Recompute::selective) kept = matmul_in;
  const size_t per_set_act = L * kept + (L - 1) * RC, per_io_act = 2 * RC;
  const size_t per_set_f32 = L * kept_f32, per_set_i32 = layers.embedding ? N : 0;
  // The shared set: the two projections and the stage's output (RC each), the backward scratch
  // (a norm's or the attention output's gradient, dqkv, dfch and, for SwiGLU, the gradient of
  // the activation's output), and what the slots do not keep.
  size_t shared_act = 3 * RC + std::max(RC, AC) + QKV + UC + (d.act_out_grad() ? FC : 0), shared_f32 = 0,
         shared_i32 = 0;
  if (recompute == Recompute::selective) shared_act += rebuilt, shared_f32 += rebuilt_f32;
  if (recompute == Recompute::full) shared_act += rebuilt + matmul_in, shared_f32 += rebuilt_f32;
  if (d.sp) shared_f32 += (d.norm_mean() ? 2 : 1) * static_cast<size_t>(d.C);  // a norm's partial weight gradients
  // Positions: of the T tokens (the position embedding's backward, or RoPE on every stage) and
  // of each residual row (the position embedding's forward).
  if (!d.learned_positions()) shared_i32 += d.T;
  if (layers.embedding) {
    if (d.learned_positions()) shared_i32 += d.T + rows;
    if (d.sp) shared_act += N * d.C;           // every token's embedding before the reduce-scatter
  }
  if (layers.head) {  // targets; final norm and its statistics; one chunk's logits; per-token losses and their sum
    shared_i32 += N;
    shared_act += RC + size_t(head_chunk_rows(static_cast<int>(N), d.Vl, compute)) * d.Vl;
    shared_f32 += stats * rows + N + 1;
  }
  const size_t S = static_cast<size_t>(slots.activations), IO = static_cast<size_t>(slots.io);
  // Mixture of experts: each sparse block keeps its routing and its experts' activations in every
  // activation set whatever the recompute mode (core/model/moe_layer.h), besides one shared
  // scratch and the routed output's buffer.
  size_t sparse = 0;
  for (int l = layers.first_layer; l < layers.end_layer; l++) sparse += d.arch.sparse_block(l) ? 1 : 0;
  size_t moe_bytes = 0;
  if (sparse > 0) {
    const int R = static_cast<int>(rows);
    const Architecture& a = d.arch;
    moe_bytes = S * sparse * MoeLayer::kept_bytes(a.n_experts, a.top_k, a.expert_hidden, d.C, R, compute, d.ep) +
                MoeLayer::scratch_bytes(a.n_experts, a.top_k, a.expert_hidden, d.C, R, compute, d.sp, d.ep) +
                dtype_size(compute) * RC;
    if (fp8_sites(fp8, layers, a).sparse > 0)
      moe_bytes += MoeLayer::fp8_scratch_bytes(a.top_k, a.expert_hidden, d.C, R, compute, d.ep);
  }
  return moe_bytes + dtype_size(compute) * (S * per_set_act + IO * per_io_act + shared_act) +
         sizeof(float) * (S * per_set_f32 + shared_f32) + dtype_size(DType::i32) * (S * per_set_i32 + shared_i32) +
         CpAttention::scratch_bytes(cp_impl, d.cp, d.B, d.T, d.Cl, d.NHl, d.NKVl, compute) +
         TensorParallel::scratch_bytes(d.tp, d.sp, N, static_cast<size_t>(d.C), compute) +
         (layers.head ? VocabParallelCrossEntropy::scratch_bytes(d.tp, N) : 0) +
         fp8_scratch_bytes(d, layers, fp8, compute);
}

size_t decoder_activation_bytes(const ModelSection& m, int B, int T, DType compute, const StageLayers& layers,
                             StageSlots slots, Recompute recompute) {
  return decoder_activation_bytes(StageDims::make(m, B, T, 1, false, 1), CpImpl::ring, compute, layers, slots, recompute);
}

size_t decoder_activation_bytes(const ModelSection& m, int B, int T, DType compute) {
  return decoder_activation_bytes(m, B, T, compute, whole_model_layers(m), StageSlots{}, Recompute::none);
}

}  // namespace pt
