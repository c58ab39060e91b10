#include "core/plan/step_time.h"

#include <algorithm>
#include <functional>

#include "core/common/format.h"
#include "core/dist/grid.h"
#include "core/metrics/flops.h"
#include "core/model/decoder_stage.h"
#include "core/model/pipeline_stages.h"
#include "core/parallel/cp_attention.h"
#include "core/plan/comm_model.h"
#include "core/plan/stage_compute.h"
#include "core/train/param_gather.h"
#include "core/train/pp_bubble.h"
#include "core/train/pp_schedule.h"
#include "core/train/pp_simulator.h"

namespace pt {

DType planned_dtype(const RunConfig& cfg) {
  return cfg.precision.compute_dtype == "fp32" ? DType::f32 : DType::bf16;
}

std::shared_ptr<const KernelTable> planning_kernels(const Hardware& hw) {
  if (hw.kernels) return hw.kernels;
  // The compiled-in table is an H100 SXM's (989.4 TFLOP/s dense bf16, 3.35 TB/s HBM3 on its
  // datasheet): another GPU gets it in proportion to its own peak and bandwidth.
  constexpr double kH100PeakTflops = 989.4, kH100HbmGbps = 3350;
  const double flop_scale = hw.peak_tflops / kH100PeakTflops, bandwidth_scale = hw.hbm_gbps / kH100HbmGbps;
  if (flop_scale == 1 && bandwidth_scale == 1) return std::make_shared<KernelTable>(KernelTable::h100());
  return std::make_shared<KernelTable>(KernelTable::h100().scaled(
      flop_scale, bandwidth_scale,
      format("%.1f TFLOP/s and %.0f GB/s (x%.3g and x%.3g)", hw.peak_tflops, hw.hbm_gbps, flop_scale, bandwidth_scale)));
}

namespace {

// Per-step latency (alpha) of NCCL's collectives over NVLink and over the network (comm_model.h).
constexpr double kNvlinkLatencyS = 2e-6, kNetworkLatencyS = 6e-6;

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
  const Link nvlink{hw.nvlink_gbps, kNvlinkLatencyS}, network{hw.network_gbps, kNetworkLatencyS};
  auto link = [&](const char* name, int size, const std::function<std::vector<int>(int)>& group_of) {
    if (size <= 1) return nvlink;
    const bool net = crosses_nodes(grid, per_node, group_of);
    t.links += std::string(t.links.empty() ? "" : ", ") + name + (net ? " network" : " NVLink");
    return net ? network : nvlink;
  };
  const Link tp_link = link("tp", par.tp, [&](int r) { return grid.group(r, Axis::tp); });
  const Link cp_link = link("cp", par.cp, [&](int r) { return grid.group(r, Axis::cp); });
  const Link pp_link = link("pp", par.pp, [&](int r) { return grid.group(r, Axis::pp); });
  const Link ep_link = link("ep", par.ep, [&](int r) { return grid.ep_group(r); });
  t.tp_crosses_nodes = par.tp > 1 && tp_link.latency_s == kNetworkLatencyS && hw.network_gbps != hw.nvlink_gbps;

  // Compute: kernel by kernel on the slowest stage, or (hw.mfu > 0) FLOPs at a flat share of the peak.
  const double flops = flops_per_token(model, m, b.seq_len, cfg.logging.flops_formula);
  const double peak = hw.peak_tflops * 1e12;
  const Recompute recompute = parse_recompute(cfg.recompute.mode);
  std::shared_ptr<const KernelTable> kernels;
  double mb_backward = 0;  // one micro-batch's backward on the slowest stage: what dp buckets hide behind
  std::vector<StageCompute> stages;  // per pipeline rank (measured kernels only)
  StageCompute slowest;
  if (hw.mfu > 0) {
    double redone = 0;
    if (recompute == Recompute::selective) redone = 4.0 * m.n_layers * m.d_model * b.seq_len;
    if (recompute == Recompute::full) redone = flops / 3;
    t.compute_s = step_tokens * flops / (gpus * peak * hw.mfu);
    t.recompute_s = step_tokens * redone / (gpus * peak * hw.mfu);
    mb_backward = t.compute_s / micro * 2 / 3;  // the backward is two thirds of the FLOPs
  } else {
    kernels = planning_kernels(hw);
    stages = stage_compute(cfg, *kernels, hw.fp8_speedup);
    for (const StageCompute& st : stages)
      if (st.total_s() > slowest.total_s()) slowest = st;
    t.compute_s = micro * (slowest.forward_s + slowest.backward_s);
    t.recompute_s = micro * slowest.recompute_s;
    t.fp8_casts_s = micro * slowest.fp8_casts_s;
    mb_backward = slowest.backward_s;
  }
  const double mb_compute = (t.compute_s + t.recompute_s) / micro;  // what overlapped p2p/tp/cp hide behind

  // The largest stage: its blocks and its parameters per rank (after the tensor-parallel split).
  int stage_layers = 0, stage_sparse = 0;
  double psi = 0;
  double gathered_bytes = 0;  // what ZeRO-3 gathers of the largest stage: FP8 weights in one byte (param_gather.h)
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
    const std::vector<bool> fp8 = fp8_gathered_params(stage, cfg);
    double bytes = 0;
    for (size_t i = 0; i < fp8.size(); i++) bytes += double(stage.specs()[i].numel) * (fp8[i] ? 1 : c);
    gathered_bytes = std::max(gathered_bytes, bytes);
  }

  // Per micro-batch on a stage's critical path.
  const double rank_tokens = static_cast<double>(b.micro_batch_size) * b.seq_len / par.cp;
  const double residual = rank_tokens * m.d_model * c;  // one residual-stream tensor
  const double attn = residual / par.tp;                // query (and output) channels on one tp rank
  const double kv = attn * m.kv_heads() / m.n_heads;     // one of K and V there (grouped-query: fewer heads)
  double tp_mb = 0, cp_mb = 0, pp_mb = 0;
  if (par.tp > 1) tp_mb = stage_layers * 4 * collective_s(Collective::all_reduce, residual, par.tp, tp_link);
  if (par.cp > 1) {
    if (parse_cp_impl(par.cp_impl) == CpImpl::ulysses)
      cp_mb = stage_layers * 2 *
              (collective_s(Collective::all_to_all, attn + 2 * kv, par.cp, cp_link) +
               collective_s(Collective::all_to_all, attn, par.cp, cp_link));
    else cp_mb = stage_layers * 3.0 * (par.cp - 1) * collective_s(Collective::send, 2 * kv, 2, cp_link);
  }
  if (par.pp > 1) pp_mb = 2.0 * par.pp_virtual_stages * collective_s(Collective::send, residual, 2, pp_link);
  double ep_mb = 0;
  if (par.ep > 1 && stage_sparse > 0) {
    const double routed = residual / (par.sequence_parallel ? par.tp : 1) * m.moe.top_k;
    ep_mb = stage_sparse * 4 * collective_s(Collective::all_to_all, routed, par.ep, ep_link);
  }
  // Exposed per micro-batch: all of it, or what the micro-batch's compute cannot hide.
  auto exposed_mb = [&](double comm, bool overlapped) { return overlapped ? exposed_s(comm, mb_compute) : comm; };
  t.tp_s = micro * exposed_mb(tp_mb, hw.overlap.tp);
  t.cp_s = micro * exposed_mb(cp_mb, hw.overlap.cp);
  t.pp_s = micro * exposed_mb(pp_mb, hw.overlap.pp);
  t.ep_s = micro * ep_mb;
  t.hidden_s = micro * (tp_mb + cp_mb + pp_mb + ep_mb) - (t.tp_s + t.cp_s + t.pp_s + t.ep_s);

  // Per step, over the dp x cp gradient group: ZeRO-0 all-reduces over all of it, ZeRO 1-3 work
  // in the shard group, and HSDP replicas all-reduce their shards. ZeRO 0-1's gradient buckets
  // run beside the last micro-batch's backward (at least the last bucket, one layer's, after
  // it); the rest is exposed unless Overlap says the system hides it.
  const int shards = par.dp / par.dp_replicate * par.cp, replicas = par.dp_replicate;
  const double grads = 4 * psi, params = gathered_bytes;
  const double last_bucket = 1.0 / std::max(1, stage_layers);
  // grad_comm: once, beside the last micro-batch's backward; scatter_mb: ZeRO-2/3's, one per
  // micro-batch, beside its backward; gather_comm: parameter gathers, beside the step's compute.
  double grad_comm = 0, scatter_mb = 0, gather_comm = 0, after_comm = 0;
  if (par.zero_stage == 0) {
    const Link dp_link = link("dp", par.dp * par.cp, [&](int r) { return grid.dp_cp_group(r); });
    grad_comm = collective_s(Collective::all_reduce, grads, par.dp * par.cp, dp_link);
  } else {
    const Link dp_link = link("dp", shards, [&](int r) { return grid.dp_shard_group(r); });
    const double scatter = collective_s(Collective::reduce_scatter, grads, shards, dp_link);
    const double gather = collective_s(Collective::all_gather, params, shards, dp_link);
    (par.zero_stage == 1 ? grad_comm : scatter_mb) = scatter;
    gather_comm = (par.zero_stage == 3 ? 2.0 * micro : 1) * gather;
    const Link rep_link = link("dp replicas", replicas, [&](int r) { return grid.dp_replicate_group(r); });
    if (replicas > 1) after_comm += collective_s(Collective::all_reduce, grads / shards, replicas, rep_link);
  }
  const double grad_exposed =
      hw.overlap.dp_grads ? exposed_s(grad_comm, mb_backward, grad_comm * last_bucket) : grad_comm;
  const double scatter_exposed =
      micro * (hw.overlap.zero ? exposed_s(scatter_mb, mb_backward, scatter_mb * last_bucket) : scatter_mb);
  const double gather_exposed = hw.overlap.zero ? exposed_s(gather_comm, t.compute_s) : gather_comm;
  t.dp_s = grad_exposed + scatter_exposed + gather_exposed + after_comm;
  t.hidden_s += grad_comm + micro * scatter_mb + gather_comm - grad_exposed - scatter_exposed - gather_exposed;

  // The optimizer updates the rank's ZeRO shard of fp32 state (all of it under ZeRO-0).
  if (kernels) t.optimizer_s = optimizer_step_s(*kernels, par.zero_stage == 0 ? psi : psi / shards);

  const double busy = t.compute_s + t.recompute_s + t.tp_s + t.cp_s + t.pp_s + t.ep_s;
  const PipeSchedule kind = parse_pipe_schedule(par.pp_schedule);
  t.bubble_s = busy * pipeline_bubble_ratio(kind, par.pp, par.pp_virtual_stages, micro);
  if (par.pp > 1 && !stages.empty()) {
    // The schedule as the trainer runs it, every rank's action list through the pipeline
    // simulator (blocking sends, as the executor's, unless Overlap::pp): each chunk's forward
    // and backward (with its recompute and half the micro-batch's exposed communication each),
    // ranks scaled by their own stage's compute, so uneven stages (pp_layers, the embeddings,
    // the head) show.
    const double v = par.pp_virtual_stages, comm_mb = (t.tp_s + t.cp_s + t.pp_s + t.ep_s) / micro;
    PipeCosts costs;
    costs.forward = (slowest.forward_s + comm_mb / 2) / v;
    costs.backward = (slowest.backward_s + slowest.recompute_s + comm_mb / 2) / v;
    const std::vector<std::vector<PipeAction>>& lists =
        shared_pipeline_schedule(kind, par.pp, par.pp_virtual_stages, micro);
    for (int r = 0; r < par.pp; r++) costs.rank_scale.push_back(stages[size_t(r)].total_s() / slowest.total_s());
    const PipeSimReport sim = simulate_pipeline(lists, par.pp_virtual_stages, micro, costs,
                                                hw.overlap.pp ? PipeComm::async : PipeComm::blocking);
    if (sim.ok()) t.bubble_s = std::max(0.0, sim.makespan - busy);
  }
  t.step_s = busy + t.bubble_s + t.dp_s + t.optimizer_s;
  t.tokens_per_s = step_tokens / t.step_s;
  t.mfu = step_tokens * flops / (t.step_s * gpus * peak);
  return t;
}

}  // namespace pt
