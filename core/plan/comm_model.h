// The time of one collective, and which collectives hide behind compute, for `picotrain plan`.
//
// Alpha-beta: a collective over n ranks takes steps x alpha (the link's per-message latency) +
// bus factor x bytes / bandwidth, bandwidth per GPU one way (nccl-tests' "bus bandwidth"
// convention, doc/PERFORMANCE.md):
//   all-reduce       ring: 2(n-1) steps, bus factor 2(n-1)/n; tree: 2 ceil(log2 n) steps, factor 2.
//                    The faster of the two, as NCCL picks (tree wins for small buffers on many ranks).
//   reduce-scatter,  ring: n-1 steps, bus factor (n-1)/n.
//   all-gather, all-to-all
//   send             1 step, factor 1.
// alpha: 2 us per step over NVLink, 6 us over the network (NCCL's small-message latencies on
// H100 nodes are of that order; the bandwidth term dominates every buffer the planner sees
// except on thousands of ranks).
//
// Overlap: which communication hides behind compute, per axis, as the trainer schedules it
// (core/train/grad_sync.h, param_gather.h, core/parallel/ring_attention.h,
// core/train/pipeline_executor.h):
//   dp grads  ZeRO 0-1 buckets are started as the last micro-batch's backward completes each
//             layer and run on NCCL's stream beside it: exposed is what the rest of that backward
//             cannot cover, and at least the last bucket (one layer's share);
//   zero      ZeRO-1/2 all-gather of the updated parameters, ZeRO-2/3's per-layer reduce-scatter
//             and ZeRO-3's gathers complete in order: exposed (ZeRO-3 prefetch is not built yet);
//             overlapped (FSDP, Megatron-LM's distributed optimizer), the gathers hide behind the
//             step's compute and each micro-batch's reduce-scatter behind its backward (at least
//             the last layer's share after it);
//   tp        the Megatron all-reduces sit between the matmuls that need them: exposed;
//   cp        the ring's send/recv is blocking: exposed (not yet overlapped with attention);
//   pp        blocking sends between stages: exposed, and the pipeline simulator's ranks wait
//             for them; overlapped, the sends are asynchronous (the simulator's PipeComm::async);
//   ep        the all-to-alls sit between router and experts: exposed.
// A published system that overlaps more (Megatron-LM's --overlap-grad-reduce, --overlap-param-
// gather, tp comm overlap) is planned with those set in Overlap; an overlapped collective costs
// what its compute window cannot hide.
#pragma once
#include <string>

namespace pt {

struct Link {
  double gbps = 0;       // per GPU, one way
  double latency_s = 0;  // alpha, per step
};

enum class Collective { all_reduce, reduce_scatter, all_gather, all_to_all, send };

// Seconds for one rank: `bytes` is the buffer (all-reduce), the whole gathered/scattered tensor
// (reduce-scatter, all-gather, all-to-all), or the message (send); n ranks in the group.
double collective_s(Collective kind, double bytes, int n, const Link& link);

// What the trainer runs beside compute (see above); the planner's default is the trainer's.
struct Overlap {
  bool dp_grads = true;     // ZeRO 0-1 gradient buckets during the last backward
  bool zero = false;  // ZeRO's parameter gathers and ZeRO-2/3's per-micro-batch reduce-scatters hidden
  bool tp = false;
  bool cp = false;
  bool pp = false;
};

// `plan --overlap`: a comma-separated list of dp (gradient buckets), zero (parameter gathers),
// tp, cp and pp; "none"; or "picotrain", the trainer's own (dp). Throws ConfigError naming the
// flag for an unknown or repeated name.
Overlap parse_overlap(const std::string& list);

// "overlapped with compute: dp grads; exposed: zero, tp, cp, pp, ep" for the plan's header.
std::string describe(const Overlap& overlap);

// The part of `comm_s` that `window_s` of compute cannot hide, never less than `tail_s` (what
// must run after the compute ends, e.g. the last gradient bucket).
double exposed_s(double comm_s, double window_s, double tail_s = 0);

}  // namespace pt
