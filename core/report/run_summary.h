// What the run report (core/report/run_report.h) needs from the trainer besides metrics.jsonl:
// the hardware, the layout, the MFU formula and peak, and where one session's time went.
// A session is one process of the run, from start (or resume) to its clean end or stop.
#pragma once
#include <string>
#include <vector>

#include "core/config/run_config.h"
#include "core/dist/timed_comm.h"
#include "core/metrics/step_timeline.h"

namespace pt {

// Where one session's time went, in seconds: on one rank while it runs, averaged over the ranks
// for the report.
struct TimeBreakdown {
  double wall = 0;        // the session, from Trainer::run()'s start to the report
  double steps = 0;       // in training steps (compute + comm + bubble + data)
  double comm = 0;        // collectives during steps (TimedComm; includes waiting for the slowest rank)
  double bubble = 0;      // pipeline parallel: waiting on pipeline neighbours (send/recv) during steps
  double data = 0;        // reading the steps' micro-batches
  double checkpoint = 0;  // writing checkpoints
  double eval = 0;        // validation
  double sample = 0;      // text samples (the log's and the report's)
  int step_count = 0;     // steps run in the session
  int checkpoints = 0;    // checkpoints written
  // The steps' time on the device's own clock, by phase (StepPhase order; core/metrics/step_timeline.h):
  // another cut of `steps`, which also holds what lies outside the device timeline (data reading,
  // host overhead before the step's first mark).
  std::array<double, kStepPhases> phases{};
  // Steps minus what is accounted for inside them (never below 0).
  double compute() const;
  // Wall minus everything above: start-up, the MFU probe, logging.
  double other() const;
  // The fields as numbers, in a fixed order, so ranks can average them with one all_reduce.
  std::vector<double> to_vector() const;
  static TimeBreakdown from_vector(const std::vector<double>& v);
};

// A step that took much longer than the session's typical step.
struct Stall {
  int step = 0;
  double ms = 0;
};

// The steps of `step_ms` ({step, milliseconds}, in order) slower than `factor` x their median;
// the first step (warm-up) is never one. Fewer than 3 steps: none.
std::vector<Stall> find_stalls(const std::vector<Stall>& step_ms, double factor, double* median_ms);

struct RunSummary {
  RunConfig cfg;                 // resolved
  std::string compute_dtype;     // what the backend computes in ("bf16", "fp32"), not "auto"
  int step = 0;                  // steps done
  bool finished = false;         // step == schedule.total_steps
  std::string stop_reason;       // a stopped session: "SIGTERM after step 7/20"
  // The checkpoint of the last step (the finished run's final checkpoint, or the stop's); ""
  // when that step was not saved (checkpoint.final=false).
  std::string final_checkpoint;
  // Hardware.
  std::string device;            // the backend's description (rank 0)
  bool gpu = false;
  int ranks = 1;
  int nodes = 1;
  std::string interconnect_node;     // within a node, as detected
  std::string interconnect_network;  // between nodes, as detected
  // The model and MFU.
  double params = 0;             // parameters of the whole model
  double flops_per_token = 0;
  std::string flops_formula;     // flops_formula_description()
  double peak_tflops = 0;
  std::string peak_source;
  std::vector<std::string> memory;  // the start-up memory account, one line per pipeline stage
  // What rank 0 really held after the session's first step (the log's `memory | step N:` line
  // without its prefix; empty when the session ran no step).
  std::string memory_measured;
  // This session: time (mean over ranks), communication by kind (mean over ranks), stalls.
  TimeBreakdown time;
  CommStats comm;
  std::vector<Stall> stalls;
  double median_step_ms = 0;
  // The run's guards this session (core/train/run_guard.h): one line per skipped non-finite
  // step, spike rollback and replay mismatch, and the corruption check's count and cost.
  int skipped_steps = 0;
  int rollbacks = 0;
  std::vector<std::string> guard_events;
  int replay_checks = 0;
  int replay_mismatches = 0;
  double replay_s = 0;
  // The report's text sample (or why there is none).
  std::string sample_prompt;
  std::string sample_text;
  std::string sample_note;
};

}  // namespace pt
