// A predicted step time for a layout, so `picotrain plan` can rank layouts it never runs:
//
//   compute     kernel by kernel from measured speeds (core/plan/stage_compute.h over the
//               kernel table of core/plan/kernel_table.h: our H100's, scaled to the GPU's peak
//               and HBM bandwidth, or one measured on it with `plan --kernels`), one micro-batch
//               on each pipeline stage; the slowest stage sets the pace. With Hardware::mfu > 0
//               the old flat model instead: model FLOPs of the step (core/metrics/flops.h) plus
//               what recompute redoes (selective: 4·L·d·T per token; full: a third of the model
//               FLOPs) spread evenly over the GPUs at peak_tflops x mfu.
//   recompute   what recompute.mode redoes (selective: attention's forward; full: the forward).
//   fp8         with precision.fp8 on, the FP8 layers' products at bf16's time / Hardware::fp8_speedup
//               plus their casts' memory traffic (stage_compute.h); the flat model ignores it.
//   optimizer   gradient norm, AdamW and zeroing over the rank's ZeRO shard (measured kernels;
//               0 in the flat model).
//   links       each group's collectives run at the bandwidth of its slowest link: NVLink when
//               every member is on one node (ranks fill nodes in order, gpus_per_node each,
//               placed on the grid by parallel.order), the network otherwise. Bandwidths are
//               per GPU, one direction.
//   collectives alpha-beta with the algorithm's bus factor (core/plan/comm_model.h): all-reduce
//               ring 2(n-1)/n or tree (the faster), reduce-scatter, all-gather and all-to-all
//               (n-1)/n, each step paying the link's latency.
//   per micro-batch, on the critical path of each pipeline stage:
//     tp        4 all-reduces per block (2 forward, 2 backward; sequence parallel's reduce-
//               scatter + all-gather pairs move the same bytes) of one residual-stream tensor
//               (B x T/cp x d_model in the compute dtype);
//     cp        ring attention: K and V go round the ring forward (cp-1 hops), and again with
//               their gradients backward: 3(cp-1) hops of 2·B·(T/cp)·(kv/tp) values per block,
//               kv = n_kv_heads x head_dim (d_model without grouped-query attention);
//               Ulysses: 4 all-to-alls per block (core/parallel/ulysses.h), q, k and v together
//               and out forward, their gradients backward: 2 of B·(T/cp)·(d + 2kv)/tp values
//               and 2 of B·(T/cp)·(d/tp);
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
//   bubble      measured kernels: the schedule's action lists through the pipeline simulator
//               (core/train/pp_simulator.h, blocking sends; asynchronous with pp overlapped),
//               each rank at its own stage's cost,
//               less the slowest stage's busy time; flat model: pipeline_bubble_ratio
//               (core/train/pp_bubble.h) x the busy time.
//   overlap     each axis's time above is what compute does not hide (Hardware::overlap,
//               comm_model.h): by default what the trainer runs beside compute, ZeRO 0-1's
//               gradient buckets during the last micro-batch's backward; all else is exposed.
//   step        m x (compute + recompute + tp + cp + pp + ep per micro-batch) + bubble + ZeRO/DP
//               communication + optimizer.
#pragma once
#include <memory>
#include <string>

#include "core/config/run_config.h"
#include "core/model/param_table.h"
#include "core/plan/comm_model.h"
#include "core/plan/kernel_table.h"
#include "core/tensor/tensor.h"

namespace pt {

// One GPU model and its links; the defaults are an H100 SXM node (core/plan/hardware_profiles.h).
struct Hardware {
  std::string gpu = "h100-sxm";  // the --gpu profile the numbers came from
  int gpus_per_node = 8;
  double gpu_memory_gib = 80;    // per GPU
  double nvlink_gbps = 450;      // GB/s per GPU inside a node (H100 SXM NVLink 4: 900 GB/s both ways)
  double network_gbps = 50;      // GB/s per GPU between nodes (one 400 Gb/s NIC per GPU)
  double peak_tflops = 989.4;    // dense bf16 per GPU (H100 SXM)
  double hbm_gbps = 3350;        // memory bandwidth per GPU, GB/s (H100 SXM)
  // The profile's dense FP8 peak over its bf16 peak (H100 SXM: 1978.9 / 989.4), what an FP8
  // layer's products gain (precision.fp8, stage_compute.h); 0: no FP8 tensor cores.
  double fp8_speedup = 1978.9 / 989.4;
  // > 0: the flat model, compute = FLOPs / (peak_tflops x mfu); 0: measured kernel speeds.
  double mfu = 0;
  // Measured kernel speeds (`plan --kernels`); null: the H100 table scaled to this GPU.
  std::shared_ptr<const KernelTable> kernels;
  // What runs beside compute; the default is what picotrain's trainer overlaps (comm_model.h).
  Overlap overlap;
};

// The kernel table a plan uses: hw.kernels, else our H100's with its FLOP rates scaled by
// peak_tflops over the H100's 989.4 and its bandwidths by hbm_gbps over 3350.
std::shared_ptr<const KernelTable> planning_kernels(const Hardware& hw);

struct StepTime {
  double compute_s = 0;     // forward + backward of every micro-batch on the slowest stage
  double fp8_casts_s = 0;   // of compute and recompute: the FP8 layers' casts (precision.fp8)
  double recompute_s = 0;   // what recompute.mode redoes, same stage
  double optimizer_s = 0;   // the optimizer step on one rank
  // Exposed communication per step, by group: what compute does not hide.
  double tp_s = 0, cp_s = 0, pp_s = 0, ep_s = 0, dp_s = 0;
  double hidden_s = 0;  // communication that runs beside compute (Hardware::overlap)
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
