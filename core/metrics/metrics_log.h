// The training log: one step line on stdout and one JSON object per logged step in
// <out_dir>/<logging.metrics_file>. Field names are a contract (docs/log.md, "The metrics file").
#pragma once
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "core/metrics/step_timeline.h"

namespace pt {

// A multiple-choice task's result (eval.task): logged as <name>_acc and <name>_acc_norm.
struct TaskAccuracy {
  std::string name;  // e.g. "hellaswag"
  double acc = 0;       // the ending with the lowest summed loss is the label's, over the examples
  double acc_norm = 0;  // ... with the lowest mean loss per token
};

struct StepMetrics {
  int step = 0;           // 1-based: the number of optimizer steps done
  int total_steps = 0;
  double loss = 0;        // token-weighted mean train loss of this step's global batch
  double lr = 0;
  double grad_norm = 0;   // global L2 norm before clipping
  double dt_ms = 0;       // wall time of the step
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;  // model FLOPs per second per device (see flops.h)
  double mfu = 0;             // tflops_per_gpu / peak, as a fraction
  // precision.fp8: tflops_per_gpu / the device's FP8 peak, as a fraction (the bound a run whose
  // every product were FP8 would be held to); unset without FP8.
  std::optional<double> mfu_fp8;
  uint64_t tokens = 0;        // tokens trained on so far
  double eta_s = 0;           // estimated seconds to the end of the run
  double data_ms = 0;          // of dt_ms: reading the step's micro-batches (rank 0)
  double comm_ms = 0;          // of dt_ms: in collectives (rank 0; core/dist/timed_comm.h)
  // Rank 0's device time by phase (forward_ms, backward_ms, grad_sync_ms, optimizer_ms, and
  // pp_comm_ms with pipeline parallel): dt_ms minus their sum is data reading and host overhead.
  std::optional<PhaseTimes> phases;
  std::optional<double> val_loss;
  std::optional<TaskAccuracy> task;  // on the steps eval.task is scored
  // Pipeline parallel only (pp > 1): the measured bubble, idle over total time of the step's
  // schedule averaged over the pipeline's ranks, and the mean time a rank spent in send/recv.
  std::optional<double> pp_bubble;
  std::optional<double> pp_wait_ms;
  // Mixture of experts only: the load-balancing loss (not in `loss`) and the busiest expert's
  // load over an even share (1 = even), each the mean over sparse blocks and micro-batches.
  std::optional<double> moe_aux;
  std::optional<double> moe_max_load;
  // Once the run has skipped a non-finite step (core/train/run_guard.h): how many so far.
  std::optional<int> skipped_steps;
};

class MetricsLog {
 public:
  // path: the metrics.jsonl file; formula: shown next to MFU on the step line.
  // keep_through_step < 0: the file starts empty. Otherwise (a resumed run) the records of steps
  // <= keep_through_step already in it are kept, later ones dropped, and new ones appended.
  MetricsLog(const std::string& path, const std::string& formula_name, int keep_through_step = -1);
  void log(const StepMetrics& m);
  // The step line, without a trailing newline (also used by tests).
  std::string step_line(const StepMetrics& m) const;

 private:
  std::ofstream jsonl_;
  std::string path_, formula_;
};

// "12s", "4m05s", "2h13m"
std::string format_duration(double seconds);

}  // namespace pt
