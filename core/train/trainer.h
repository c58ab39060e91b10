// Trainer: the training loop. Each step consumes one global batch
// (batch.global_batch_tokens tokens from the global cursor) as grad_accum_steps micro-batches,
// sums their gradients, clips, updates with AdamW at the scheduled learning rate, and logs.
// Validation runs every data.val_every_steps steps and after the last step (or only after the
// last with data.final_val), and so does the multiple-choice task eval.task (eval.every_steps;
// trainer_eval.cpp).
//
// Data parallel: the ranks lie on the Grid (dp x tp x pp x cp; dp with ZeRO 0-3 and HSDP, and
// pp run here). DP rank d reads sequences (m*dp + d)*B .. +B-1 of micro-step m from the global
// cursor, so together the ranks read exactly what one rank would; GradSync reduces gradients
// over dp x cp, and the loss is the token-weighted mean over dp x cp. Only rank 0 prints the
// log and writes the run directory's files.
//
// Pipeline parallel: each rank holds only its pipeline stage's parameters (stage_table(),
// core/model/pipeline_stages.h) and runs its part of the schedule through the PipelineExecutor
// (core/train/pipeline_executor.h), which also runs the one-rank case (pp = 1). The grad_accum_steps
// micro-batches of a step are the schedule's micro-batches; the loss is computed on the last
// stage and shared over the pipeline; the gradient norm adds up over the stages (the tied wte
// counted once).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <optional>
#include <vector>

#include "core/ckpt/checkpointer.h"
#include "core/config/run_config.h"
#include "core/data/data_loader.h"
#include "core/dist/grid.h"
#include "core/dist/process_groups.h"
#include "core/dist/world.h"
#include "core/eval/mc_score.h"
#include "core/metrics/metrics_log.h"
#include "core/metrics/step_timeline.h"
#include "core/model/decoder_stage.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/model/sample_run.h"
#include "core/parallel/zigzag.h"
#include "core/report/run_summary.h"
#include "core/report/session_log.h"
#include "core/ops/ops.h"
#include "core/train/fp8_history_state.h"
#include "core/train/grad_sync.h"
#include "core/train/optimizer.h"
#include "core/train/param_gather.h"
#include "core/train/pipeline_executor.h"
#include "core/train/progress_watchdog.h"
#include "core/train/run_guard.h"
#include "core/train/zero_hooks.h"

namespace pt {

struct StepResult {
  double loss = 0;  // token-weighted mean over the global batch
  double grad_norm = 0;
  double lr = 0;
  // pp > 1: the measured bubble (pipeline_bubble_of: send/recv over schedule time, on the device's
  // clock, mean over the pipeline's ranks) and the mean time a rank spent in send/recv.
  double pp_bubble = 0;
  double pp_wait_ms = 0;
  // Mixture of experts (0 for a dense model): the balancing loss and the busiest expert's load
  // over an even share, each the mean over sparse blocks and micro-batches (moe_layer.h).
  double moe_aux = 0;
  double moe_max_load = 0;
  // This rank's device time by phase (core/metrics/step_timeline.h); the step has synchronised.
  PhaseTimes phases;
  // The non-finite guard skipped the update (loss or grad_norm is not finite): nothing changed.
  bool skipped = false;
  bool skip_ends_run = false;  // it was run.max_skipped_steps-th in a row: run() ends the run
  uint64_t first_token = 0;  // the step's data: the global token cursor it read from
  // The corruption check ran (run.replay_every_steps): the world ranks whose replay differed.
  bool replayed = false;
  double replay_s = 0;
  std::vector<int> replay_mismatches;
};

// Faults for tests (never a config key): each names the 1-based steps it hits on the rank whose
// Trainer it is set on, to prove that the run's guards catch them. Each hits once: a step
// trained again after a rollback runs clean.
struct InjectedFaults {
  std::set<int> nan_gradient;         // the loss gradient is NaN, so every gradient is
  std::set<int> inf_loss;             // the loss sum is +Inf
  std::map<int, double> loss_scale;   // the loss sum times this (a loss spike)
  std::set<int> flip_replay_bit;      // the corruption check's second run differs in one bit
};

class Trainer {
 public:
  // With data.train empty the trainer is for evaluation only (`picotrain eval`,
  // core/eval/eval_command.h): it reads no training data and step() refuses to run.
  Trainer(const RunConfig& cfg, const World& world, Ops& ops);
  ~Trainer();

  // One optimizer step on the next global batch.
  StepResult step();
  // Mean loss over the validation tokens (data.val_tokens; 0 = the whole val set). Rank 0 logs
  // its progress when it takes longer than 10 s.
  double evaluate();
  // The micro-batches one validation reads (over all dp ranks): data.val_tokens, or the whole val
  // set, rounded down to whole batches (at least one).
  int64_t val_batches() const;
  // Whether the validation runs after step `step` (data.val_every_steps, data.final_val).
  bool validates_after(int step) const;
  // Multiple-choice scoring (core/eval/mc_score.h), the same forward path as evaluate(): each
  // row's summed loss over its ending's tokens, on every rank (collective over the world). The
  // rows' micro-batches (batch.micro_batch_size rows of seq_len) go to the dp ranks in turn, so
  // the result does not depend on the layout.
  std::vector<double> mc_row_losses(const McLayout& layout);
  // eval.task scored now (collective); nullopt without one.
  std::optional<McScores> score_eval_task();
  // Whether eval.task is scored after step `step` (eval.every_steps, and after the last one).
  bool scores_task_after(int step) const;
  // The log's name of eval.task's fields (<name>_acc): eval.name, else from its file name.
  std::string eval_task_name() const;
  // The whole run: start-up report, steps with logging and validation, final summary.
  void run();

  // Writes a checkpoint of the current state now (checkpoint.dir) and returns its directory.
  std::string save_checkpoint();
  const ckpt::Checkpointer& checkpointer() const { return *ckpt_; }
  // The checkpoint that holds the current step's state (after run(): the run's final checkpoint,
  // or a stop's); "" when that step is not on disk. The same on every rank.
  std::string final_checkpoint() const;

  int steps_done() const { return step_; }
  uint64_t cursor() const { return cursor_; }
  // The parameters this rank holds; under expert parallel all but its routed experts, which
  // expert_params() holds (null otherwise).
  ParamStore& params() { return *store_; }
  ParamStore* expert_params() { return expert_store_.get(); }
  // The parameters this rank's pipeline stage holds (the whole model when pp == 1), each cut to
  // this rank's tensor-parallel piece (ParamSpec::shape; global_shape is the whole one).
  const ParamTable& stage_table() const { return *stage_table_; }
  PipelineExecutor& pipeline() { return *executor_; }
  const OptimizerGraphs& optimizer_graphs() const { return optim_graphs_; }
  // Every call, byte and second of this rank's communication so far (the groups' TimedComms).
  const CommStats& comm_stats() const { return *groups_.comm_stats; }
  const Grid& grid() const { return *grid_; }
  const ProcessGroups& groups() const { return groups_; }
  // The fp32 master weights of this rank's stage in stage_table() order, whole parameters
  // (global shapes): gathered from the ZeRO shards and the tensor-parallel pieces. Collective
  // over the shard and tp groups: every rank of them must call it.
  std::vector<float> gather_master();
  // Called with every micro-batch this rank reads (B*T inputs and targets), for tests that
  // check which tokens each DP rank saw.
  using BatchObserver = std::function<void(int micro, const int32_t* inputs, const int32_t* targets, size_t n)>;
  void set_batch_observer(BatchObserver observer) { batch_observer_ = std::move(observer); }
  void inject_faults(InjectedFaults faults) { faults_ = std::move(faults); }
  // The run's guards' state: skipped steps, rollbacks, the spike window (what checkpoints save).
  const ckpt::HealthRecord& health() const { return guard_->record(); }

 private:
  // The part of construction each rank can do alone (checks, allocation, data, resume); see
  // agree_on_startup in world.h.
  void setup_local();
  // The run's initial weights (run.seed) into the stores: a fresh run's, not a resumed one's.
  void init_weights();
  void print_startup() const;
  // After a step: writes the checkpoint that is due (periodic, the end of a finished run unless
  // checkpoint.final=false, or asked for by a stop signal), collectively on every rank. Returns
  // true when a signal asked the run to stop.
  bool checkpoint_if_due(bool run_finished);
  int64_t sequences_per_step() const;
  // The tokens of one global batch: sequences_per_step() x seq_len.
  uint64_t tokens_per_step() const { return static_cast<uint64_t>(sequences_per_step()) * cfg_.batch.seq_len; }
  // The corruption check of the step just computed (before its update): micro-batch 0's forward
  // again, compared bit for bit on every rank; fills r's replay fields (collective).
  void replay_check(StepResult& r);
  // After step(): counts a skipped step (and ends the run after run.max_skipped_steps in a row)
  // or checks the loss for a spike and rolls back to the newest checkpoint. Returns true when it
  // rolled back (the step counter and the cursor moved). Collective when run.spike is on.
  bool guard_step(const StepResult& r, RunSummary& summary);
  // Where a step's data lies, for the log: "tokens A..B of the training set (cursor A)".
  std::string describe_step_data(uint64_t first_token) const;
  // Reads the B sequences from first_sequence at the cursor and keeps this rank's context-
  // parallel part of each (B x T/cp); `micro` >= 0: a training micro-batch (for the observer).
  void read_batch(DataLoader& data, uint64_t cursor, int64_t first_sequence, int micro, int32_t* inputs,
                  int32_t* targets);
  // This rank's context-parallel part of the whole micro-batch in global_inputs_/global_targets_.
  void take_cp_part(int32_t* inputs, int32_t* targets) const;
  // Tokens in data.train (0 for an evaluation-only trainer, which has none).
  uint64_t train_tokens() const { return train_data_ ? train_data_->total_tokens() : 0; }
  // eval.task's rows (setup_local); null without one.
  void load_eval_task();
  std::unique_ptr<McLayout> eval_task_;

  RunConfig cfg_;
  World world_;
  Ops& ops_;
  ParamTable table_;                         // the whole model
  std::unique_ptr<ParamTable> stage_table_;  // this rank's pipeline stage (= table_ with pp == 1)
  // Expert parallel (parallel.ep > 1; else null): stage_table_ split into the dense part, which
  // store_ holds, and this rank's routed experts, which expert_store_ holds, with their own
  // ZeRO halves over the ranks holding the same experts (core/model/expert_split.h).
  std::unique_ptr<ParamTable> dense_table_, expert_table_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<ParamStore> expert_store_;
  std::unique_ptr<ParamGather> expert_gather_;
  std::unique_ptr<GradSync> expert_sync_;
  ExpertOptimizerPart expert_optim_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::unique_ptr<DataLoader> train_data_, val_data_;
  std::unique_ptr<ckpt::Checkpointer> ckpt_;
  std::unique_ptr<Fp8HistoryState> fp8_history_;  // delayed FP8 scaling's checkpoint state; null without
  std::unique_ptr<Grid> grid_;
  Coord coord_;  // this rank's place on the grid
  ProcessGroups groups_;
  std::unique_ptr<ParamGather> gather_;
  std::unique_ptr<GradSync> grad_sync_;
  std::unique_ptr<ZeroHooks> hooks_;
  NormScope norm_scope_;  // the gradient norm over the pipeline's stages
  StepTimeline timeline_;  // step()'s device time by phase
  OptimizerGraphs optim_graphs_;  // run.cuda_graphs: the optimizer's update
  BatchObserver batch_observer_;
  InjectedFaults faults_;
  std::unique_ptr<RunGuard> guard_;  // made in setup_local, restored with the checkpoint
  std::vector<int32_t> inputs_, targets_;  // host staging for one step's micro-batches (this rank's tokens)
  std::vector<int32_t> global_inputs_, global_targets_;  // one whole micro-batch (context parallel)
  std::unique_ptr<CpSplit> cp_split_;
  // Ends this rank when the run stops making progress (run.hang_timeout_s); lives during run().
  std::unique_ptr<ProgressWatchdog> watchdog_;
  int step_ = 0;         // optimizer steps done
  uint64_t cursor_ = 0;  // global token position of the next step's first token

  // The run report (core/report/): this session's time, kept by run(), step()'s data loop and
  // save_checkpoint(), and the report written when the session ends (trainer_report.cpp).
  TimeBreakdown time_;
  double step_data_s_ = 0;  // reading the current step's micro-batches
  // What start-up spent where (the log's start-up line): {part, seconds}, in order.
  std::vector<std::pair<std::string, double>> startup_parts_;
  // Adds the time since `t0` to startup_parts_ under `part` and restarts `t0`.
  void startup_lap(const char* part, std::chrono::steady_clock::time_point& t0);
  void print_startup_time() const;
  // precision.matmul_algos (trainer_matmul_algos.cpp). Before the session's first step: use the
  // choices of a file (given, or a resumed timed run's own) or start timing; after that step,
  // when timing: agree the choices over the world, use them and write them (collective).
  void start_matmul_algos();
  void commit_matmul_algos();
  bool matmul_commit_due_ = false;
  // run.cuda_graphs (core/train/cuda_graphs.h): what rules them out for this run ("" if nothing),
  // whether a recording failed (the run then stays op by op), the session's steps so far (graphs
  // start from its second) and whether the log has said they are in use.
  std::string graphs_blocker_;
  bool graphs_failed_ = false;
  bool graphs_logged_ = false;
  int session_steps_ = 0;
  // Before a step: graphs on when they are wanted and may be. After its schedule and after its
  // update (`step_done`): a failed recording turns them off with a warning; the first step
  // that recorded them says so once it is done.
  void prepare_graphs();
  void report_graphs(bool step_done);
  // The log's sample at the end of the run (logging.sample_every > 0; rank 0), which the report
  // shows rather than sampling the same weights again.
  std::optional<TrainingSample> final_sample_;
  // Collective over the world: averages this session's time over the ranks, counts the nodes,
  // samples the report's text (pp == 1), then rank 0 ends the session's record in `sessions`
  // and writes report.json and report.md. `summary` arrives with the MFU fields filled in.
  void write_session_report(RunSummary summary, const std::vector<Stall>& step_ms, SessionLog* sessions,
                            const std::string& metrics_path);
};

}  // namespace pt
