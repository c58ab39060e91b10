// A predicted step time for a layout, from FLOPs and a simple communication model, so `picotrain
// plan` can rank layouts it never runs. It is an estimate to order layouts by, not a promise:
//
//   compute     model FLOPs of the step (core/metrics/flops.h, logging.flops_formula) plus what
//               activation recompute redoes (selective: the attention forward, 4·L·d·T per
//               token; full: one more forward, a third of the model FLOPs), spread evenly over
//               the GPUs at peak_tflops x mfu.
//   links       each group's collectives run at the bandwidth of its slowest link: NVLink when
//               every member is on one node (ranks fill nodes in order, gpus_per_node each,
//               placed on the grid by parallel.order), the network otherwise. Bandwidths are
//               per GPU, one direction.
//   collectives ring algorithms: all-reduce moves 2(n-1)/n of the buffer per rank,
//               reduce-scatter, all-gather and all-to-all (n-1)/n; no latency term.
//   per micro-batch, on the critical path of each pipeline stage:
//     tp        4 all-reduces per block (2 forward, 2 backward; sequence parallel's reduce-
//               scatter + all-gather pairs move the same bytes) of one residual-stream tensor
//               (B x T/cp x d_model in the compute dtype);
//     cp        ring attention: K and V go round the ring forward (cp-1 hops), and again with
//               their gradients backward: 3(cp-1) hops of 2·B·(T/cp)·(d/tp) values per block;
//               Ulysses: 8 all-to-alls of B·(T/cp)·(d/tp) values per block (q, k, v, out, both ways);
//     pp        one activation forward and one gradient backward per chunk (v per rank);
//     ep        mixture of experts under expert parallel: 4 all-to-alls per sparse block (the
//               routed rows to their experts' ranks and back, forward and backward) of
//               top_k x the rows a rank routes (B·T/cp, /tp with sequence parallel) x d_model,
//               over the ep group (ep of the dp ranks).
//   per step, over dp x cp (ZeRO, core/train/grad_sync.h), Ψ = a rank's parameters on the
//   largest stage, S = the ZeRO shard group (dp_shard·cp), R = HSDP replicas:
//     ZeRO-0    all-reduce of the fp32 gradient (4Ψ bytes) over dp·cp;
//     ZeRO-1    reduce-scatter of 4Ψ, all-gather of the updated parameters (cΨ), over S;
//     ZeRO-2    as 1, with a reduce-scatter per micro-batch (m of them);
//     ZeRO-3    m reduce-scatters of 4Ψ and 2m all-gathers of cΨ (forward and backward);
//     HSDP      + an all-reduce of the 4Ψ/S shard over R.
//   bubble      pipeline_bubble_ratio (core/train/pp_bubble.h) x the stage's busy time.
//   step        m x (compute + tp + cp + pp + ep per micro-batch) + bubble + ZeRO/DP communication.
// Nothing overlaps communication with compute (the trainer's collectives are blocking today),
// and stages are taken as balanced, so the estimate errs on the slow side.
#pragma once
#include <string>

#include "core/config/run_config.h"
#include "core/model/param_table.h"
#include "core/tensor/tensor.h"

namespace pt {

struct Hardware {
  int gpus_per_node = 8;
  double gpu_memory_gib = 80;    // per GPU
  double nvlink_gbps = 450;      // GB/s per GPU inside a node (H100 SXM NVLink 4: 900 GB/s both ways)
  double network_gbps = 50;      // GB/s per GPU between nodes (one 400 Gb/s NIC per GPU)
  double peak_tflops = 989.4;    // dense bf16 per GPU (H100 SXM)
  double mfu = 0.5;              // the share of the peak the compute reaches
};

struct StepTime {
  double compute_s = 0;
  double tp_s = 0, cp_s = 0, pp_s = 0, ep_s = 0, dp_s = 0;  // communication per step, by group
  double bubble_s = 0;
  double step_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;  // model FLOPs (no recompute) over step_s x GPUs x peak
  // The link each group of more than one rank uses, e.g. "tp NVLink, dp network".
  std::string links;
  bool tp_crosses_nodes = false;
  double comm_s() const { return tp_s + cp_s + pp_s + ep_s + dp_s; }
};

// The compute dtype a layout is planned in: fp32 when the config says so, else bf16 (GPUs).
DType planned_dtype(const RunConfig& cfg);

StepTime estimate_step_time(const RunConfig& cfg, const ParamTable& model, const Hardware& hw);

}  // namespace pt
