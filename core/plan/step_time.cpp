#include "core/plan/step_time.h"

#include <algorithm>
#include <functional>

#include "core/dist/grid.h"
#include "core/metrics/flops.h"
#include "core/model/decoder_stage.h"
#include "core/model/pipeline_stages.h"
#include "core/parallel/cp_attention.h"
#include "core/train/pp_bubble.h"
#include "core/train/pp_schedule.h"

namespace pt {

DType planned_dtype(const RunConfig& cfg) {
  return cfg.precision.compute_dtype == "fp32" ? DType::f32 : DType::bf16;
}

namespace {

// Seconds per rank for a ring collective over n ranks on `bytes` of buffer at `gbps` GB/s.
double all_reduce_s(double bytes, int n, double gbps) { return 2.0 * (n - 1) / n * bytes / (gbps * 1e9); }
double gather_s(double bytes, int n, double gbps) { return 1.0 * (n - 1) / n * bytes / (gbps * 1e9); }

// True when some group of the kind `group_of` returns has members on different nodes.
bool crosses_nodes(const Grid& grid, int gpus_per_node, const std::function<std::vector<int>(int)>& group_of) {
  for (int r = 0; r < grid.world_size(); r++)
    for (int member : group_of(r))
      if (member / gpus_per_node != r / gpus_per_node) return true;
  return false;
}

}  // namespace

StepTime estimate_step_time(const RunConfig& cfg, const ParamTable& model, const Hardware& hw) {
  const auto& m = cfg.model;
  const auto& par = cfg.parallel;
  const auto& b = cfg.batch;
  const int gpus = par.dp * par.tp * par.pp * par.cp, micro = b.grad_accum_steps;
  const double c = static_cast<double>(dtype_size(planned_dtype(cfg)));
  const double step_tokens = static_cast<double>(b.global_batch_tokens);

  // Which link each group runs over.
  const Grid grid(par);
  const int per_node = std::max(1, hw.gpus_per_node);
  StepTime t;
  auto link = [&](const char* name, int size, const std::function<std::vector<int>(int)>& group_of) {
    if (size <= 1) return hw.nvlink_gbps;
    const bool net = crosses_nodes(grid, per_node, group_of);
    t.links += std::string(t.links.empty() ? "" : ", ") + name + (net ? " network" : " NVLink");
    return net ? hw.network_gbps : hw.nvlink_gbps;
  };
  const double tp_bw = link("tp", par.tp, [&](int r) { return grid.group(r, Axis::tp); });
  const double cp_bw = link("cp", par.cp, [&](int r) { return grid.group(r, Axis::cp); });
  const double pp_bw = link("pp", par.pp, [&](int r) { return grid.group(r, Axis::pp); });
  const double ep_bw = link("ep", par.ep, [&](int r) { return grid.ep_group(r); });
  t.tp_crosses_nodes = par.tp > 1 && tp_bw == hw.network_gbps && hw.network_gbps != hw.nvlink_gbps;

  // Compute, spread evenly over the GPUs.
  const double flops = flops_per_token(model, m, b.seq_len, cfg.logging.flops_formula);
  double redone = 0;
  const Recompute recompute = parse_recompute(cfg.recompute.mode);
  if (recompute == Recompute::selective) redone = 4.0 * m.n_layers * m.d_model * b.seq_len;
  if (recompute == Recompute::full) redone = flops / 3;
  const double peak = hw.peak_tflops * 1e12;
  t.compute_s = step_tokens * (flops + redone) / (gpus * peak * hw.mfu);

  // The largest stage: its blocks and its parameters per rank (after the tensor-parallel split).
  int stage_layers = 0, stage_sparse = 0;
  double psi = 0;
  const Architecture arch = describe_architecture(m);
  for (int r = 0; r < par.pp; r++) {
    const std::vector<StageLayers> chunks = pipeline_chunks(m, par, r);
    int layers = 0, sparse = 0;
    for (const auto& ch : chunks) {
      layers += ch.layers();
      for (int l = ch.first_layer; l < ch.end_layer; l++) sparse += arch.sparse_block(l) ? 1 : 0;
    }
    stage_layers = std::max(stage_layers, layers);
    stage_sparse = std::max(stage_sparse, sparse);
    const ParamTable stage = tensor_parallel_table(stage_param_table(model, chunks, m.n_layers), par.tp, 0);
    psi = std::max(psi, static_cast<double>(stage.total_numel()));
  }

  // Per micro-batch on a stage's critical path.
  const double rank_tokens = static_cast<double>(b.micro_batch_size) * b.seq_len / par.cp;
  const double residual = rank_tokens * m.d_model * c;  // one residual-stream tensor
  const double attn = residual / par.tp;                // attention channels on one tp rank
  double tp_mb = 0, cp_mb = 0, pp_mb = 0;
  if (par.tp > 1) tp_mb = stage_layers * 4 * all_reduce_s(residual, par.tp, tp_bw);
  if (par.cp > 1) {
    if (parse_cp_impl(par.cp_impl) == CpImpl::ulysses) cp_mb = stage_layers * 8 * gather_s(attn, par.cp, cp_bw);
    else cp_mb = stage_layers * 3.0 * (par.cp - 1) * 2 * attn / (cp_bw * 1e9);
  }
  if (par.pp > 1) pp_mb = 2.0 * par.pp_virtual_stages * residual / (pp_bw * 1e9);
  double ep_mb = 0;
  if (par.ep > 1 && stage_sparse > 0) {
    const double routed = residual / (par.sequence_parallel ? par.tp : 1) * m.moe.top_k;
    ep_mb = stage_sparse * 4 * gather_s(routed, par.ep, ep_bw);
  }
  t.tp_s = micro * tp_mb;
  t.cp_s = micro * cp_mb;
  t.pp_s = micro * pp_mb;
  t.ep_s = micro * ep_mb;

  // Per step, over the dp x cp gradient group: ZeRO-0 all-reduces over all of it, ZeRO 1-3 work
  // in the shard group, and HSDP replicas all-reduce their shards.
  const int shards = par.dp / par.dp_replicate * par.cp, replicas = par.dp_replicate;
  const double grads = 4 * psi, params = c * psi;
  if (par.zero_stage == 0) {
    const double bw = link("dp", par.dp * par.cp, [&](int r) { return grid.dp_cp_group(r); });
    t.dp_s = all_reduce_s(grads, par.dp * par.cp, bw);
  } else {
    const double bw = link("dp", shards, [&](int r) { return grid.dp_shard_group(r); });
    const double scatters = par.zero_stage == 1 ? 1 : micro, gathers = par.zero_stage == 3 ? 2.0 * micro : 1;
    t.dp_s = scatters * gather_s(grads, shards, bw) + gathers * gather_s(params, shards, bw);
    const double rep_bw = link("dp replicas", replicas, [&](int r) { return grid.dp_replicate_group(r); });
    if (replicas > 1) t.dp_s += all_reduce_s(grads / shards, replicas, rep_bw);
  }

  const double busy = t.compute_s + t.tp_s + t.cp_s + t.pp_s + t.ep_s;
  const PipeSchedule kind = parse_pipe_schedule(par.pp_schedule);
  t.bubble_s = busy * pipeline_bubble_ratio(kind, par.pp, par.pp_virtual_stages, micro);
  t.step_s = busy + t.bubble_s + t.dp_s;
  t.tokens_per_s = step_tokens / t.step_s;
  t.mfu = step_tokens * flops / (t.step_s * gpus * peak);
  return t;
}

}  // namespace pt
