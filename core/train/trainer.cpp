// The trainer's loop (trainer.h): one step, validation, checkpoints and run(). Its start-up is in
// trainer_startup.cpp, the guards against training on garbage in trainer_guards.cpp, and the
// run report in trainer_report.cpp.
#include "core/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "core/ckpt/stop_signal.h"
#include "core/common/console.h"
#include "core/metrics/flops.h"
#include "core/metrics/peak_probe.h"
#include "core/metrics/process_clock.h"
#include "core/model/expert_split.h"
#include "core/model/sample_run.h"
#include "core/plan/stage_memory.h"
#include "core/train/lr_schedule.h"
#include "core/train/work_progress.h"
#include "core/train/memory_plan.h"
#include "core/train/optimizer.h"
#include "core/train/pp_bubble.h"
#include "core/train/shard_gather.h"

namespace pt {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

void Trainer::read_batch(DataLoader& data, uint64_t cursor, int64_t first_sequence, int micro, int32_t* inputs,
                         int32_t* targets) {
  const int B = cfg_.batch.micro_batch_size, T = cfg_.batch.seq_len;
  const size_t n = static_cast<size_t>(B) * T;
  if (cfg_.parallel.cp == 1) {
    data.load(cursor, first_sequence, inputs, targets);
    if (batch_observer_ && micro >= 0) batch_observer_(micro, inputs, targets, n);
    return;
  }
  global_inputs_.resize(n);
  global_targets_.resize(n);
  data.load(cursor, first_sequence, global_inputs_.data(), global_targets_.data());
  if (batch_observer_ && micro >= 0) batch_observer_(micro, global_inputs_.data(), global_targets_.data(), n);
  take_cp_part(inputs, targets);
}

void Trainer::take_cp_part(int32_t* inputs, int32_t* targets) const {
  const int B = cfg_.batch.micro_batch_size;
  const std::vector<int32_t> in = cp_split_->take(global_inputs_, B, coord_.cp);
  const std::vector<int32_t> tg = cp_split_->take(global_targets_, B, coord_.cp);
  std::copy(in.begin(), in.end(), inputs);
  std::copy(tg.begin(), tg.end(), targets);
}

Trainer::~Trainer() = default;

int64_t Trainer::sequences_per_step() const {
  return static_cast<int64_t>(cfg_.batch.grad_accum_steps) * cfg_.parallel.dp * cfg_.batch.micro_batch_size;
}

StepResult Trainer::step() {
  check(train_data_ != nullptr, "Trainer::step needs data.train (this trainer was made for evaluation only)");
  const int B = cfg_.batch.micro_batch_size, T = cfg_.batch.seq_len;
  const int accum = cfg_.batch.grad_accum_steps, dp = cfg_.parallel.dp, pp = cfg_.parallel.pp;
  // The loss is the token-weighted mean over the whole global batch, so each token's
  // gradient is scaled by 1 / (tokens in the global batch), whatever the split.
  const double batch_tokens = static_cast<double>(tokens_per_step());
  const float dloss = static_cast<float>(1.0 / batch_tokens);

  // The step's micro-batches, read by the stages that need them (the first and the last): this
  // rank's T / cp tokens of each sequence.
  const size_t n = static_cast<size_t>(B) * (T / cfg_.parallel.cp);
  const int this_step = step_ + 1;
  StepResult r;
  r.first_token = cursor_;
  const int replay_every = cfg_.run.replay_every_steps;
  const bool replay_due = replay_every > 0 && this_step % replay_every == 0;
  const auto data_start = Clock::now();  // the report's data wait
  if (executor_->has_embedding() || executor_->has_head())
    for (int micro = 0; micro < accum; micro++) {
      const int64_t first_sequence = (static_cast<int64_t>(micro) * dp + coord_.dp) * B;
      read_batch(*train_data_, cursor_, first_sequence, micro, inputs_.data() + micro * n, targets_.data() + micro * n);
    }
  step_data_s_ = seconds_since(data_start);
  // The device's time from here on, by phase (the gradients' zeroing counts as backward's).
  timeline_.start(StepPhase::backward);
  grad_sync_->start_step();
  if (expert_sync_) expert_sync_->start_step();
  executor_->record_fingerprints(replay_due);
  const int chunks = static_cast<int>(executor_->chunks().size());
  for (int c = 0; c < chunks; c++) executor_->chunk(c).fp8_begin_step();
  const float step_dloss = faults_.nan_gradient.erase(this_step) ? std::nanf("") : dloss;
  prepare_graphs();
  PipelineStepStats ps = executor_->train_step(inputs_.data(), targets_.data(), step_dloss, &timeline_);
  report_graphs(false);  // a failed recording turns the optimizer's off too, before it runs
  if (faults_.inf_loss.erase(this_step)) ps.loss_sum = std::numeric_limits<double>::infinity();
  if (const auto f = faults_.loss_scale.find(this_step); f != faults_.loss_scale.end()) {
    ps.loss_sum *= f->second;
    faults_.loss_scale.erase(f);
  }
  timeline_.enter(StepPhase::grad_sync);
  grad_sync_->finish_step();
  if (expert_sync_) expert_sync_->finish_step();
  // This rank's loss sum and tokens with a target, and its sparse blocks' routing statistics
  // (each the same on every tp and cp rank of a micro-batch, so their ratio survives the sum).
  MoeStats moe;
  for (int c = 0; c < chunks; c++) {
    const MoeStats m = executor_->chunk(c).take_moe_stats();
    moe.aux_sum += m.aux_sum;
    moe.max_load_sum += m.max_load_sum;
    moe.layer_batches += m.layer_batches;
  }
  double sums[5] = {ps.loss_sum, ps.tokens, moe.aux_sum, moe.max_load_sum, moe.layer_batches};
  groups_.dp_cp->all_reduce(sums, 5);  // the token-weighted mean over dp x cp
  cursor_ = (cursor_ + tokens_per_step()) % train_data_->total_tokens();
  if (replay_due) replay_check(r);  // before the update: a mismatch ends the run with nothing applied

  r.lr = lr_at(cfg_.optim, cfg_.schedule, step_);
  timeline_.enter(StepPhase::optimizer);
  // The non-finite guard: a NaN or infinite loss (on the head's ranks, already agreed over dp x
  // cp) or gradient norm skips the update on every rank. AdamW's bias correction counts the
  // updates done, so a skipped step leaves no trace in the optimizer.
  NonFiniteGuard nonfinite;
  nonfinite.enabled = guard_->guards_nonfinite();
  nonfinite.loss_nonfinite = nonfinite.enabled && !std::isfinite(sums[0]);
  const OptimizerStats s = adamw_step(ops_, *store_, cfg_.optim, r.lr, guard_->updates(step_) + 1, groups_.shard.get(),
                                      norm_scope_, expert_store_ ? &expert_optim_ : nullptr, nonfinite, &optim_graphs_);
  report_graphs(true);
  r.skipped = !s.updated;
  if (r.skipped) {
    r.skip_ends_run = guard_->record_skip();
  } else {
    guard_->record_update();
    gather_->gather_updated();  // ZeRO-1/2: every rank's updated piece back into the full params
    if (expert_gather_) expert_gather_->gather_updated();
  }
  // Delayed FP8 scaling: the step's amaxes join the history (a skipped step's are dropped).
  for (int c = 0; c < chunks; c++) executor_->chunk(c).fp8_end_step(!r.skipped);
  r.grad_norm = s.grad_norm;
  r.phases = timeline_.finish();
  if (pp > 1) {
    // The loss lives on the last stage; the bubble and the waits (on the device's clock, so known
    // only now) are averaged over the stages: one reduction for all four.
    double pipe[7] = {sums[0], sums[1], pipeline_bubble_of(r.phases), r.phases[StepPhase::pp_comm],
                      sums[2], sums[3], sums[4]};
    groups_.pp->all_reduce(pipe, 7);
    sums[0] = pipe[0];
    sums[1] = pipe[1];
    r.pp_bubble = pipe[2] / pp;
    r.pp_wait_ms = pipe[3] / pp;
    for (int i = 2; i < 5; i++) sums[i] = pipe[i + 2];  // the stages' sparse blocks, all of them
  }
  r.loss = sums[0] / sums[1];
  if (sums[4] > 0) {
    r.moe_aux = sums[2] / sums[4];
    r.moe_max_load = sums[3] / sums[4];
  }
  step_++;
  session_steps_++;
  return r;
}

void Trainer::prepare_graphs() {
  // From the session's second step: the first grows every buffer that grows and, with
  // precision.matmul_algos=timed, times the products (which waits for the device).
  if (!cfg_.run.cuda_graphs || !graphs_blocker_.empty() || graphs_failed_ || executor_->graphs_on()) return;
  if (session_steps_ < 1 || matmul_commit_due_) return;
  executor_->use_graphs(true);
  optim_graphs_.use(true);
}

void Trainer::report_graphs(bool step_done) {
  std::string why = executor_->take_graph_fallback();
  if (why.empty()) why = optim_graphs_.take_fallback();
  if (!why.empty()) {
    // Said by the rank it happened on (each rank records its own work; the others may go on).
    graphs_failed_ = true;
    executor_->use_graphs(false);
    optim_graphs_.use(false);
    print_warning(format("run.cuda_graphs%s: %s; the run goes on op by op (the step lost nothing)",
                         world_.size > 1 ? format(" on rank %d", world_.rank).c_str() : "", why.c_str()));
    return;
  }
  if (!step_done || graphs_logged_ || executor_->graphs_recorded() == 0) return;
  graphs_logged_ = true;
  if (world_.rank == 0)
    print_linef(Stream::out, "graphs    | step %d recorded %d forwards and backwards%s as CUDA graphs; each replays "
                "with one launch from now on", step_ + 1, executor_->graphs_recorded(),
                optim_graphs_.recorded() > 0 ? " and the optimizer's update" : "");
}

std::vector<float> Trainer::gather_master() {
  std::vector<float> local = gather_shards(*store_, store_->master_shard(), *groups_.shard, ops_);
  if (expert_store_) {
    const std::vector<float> experts =
        gather_shards(*expert_store_, expert_store_->master_shard(), *groups_.expert_shard, ops_);
    local = gather_expert_parallel(*stage_table_, cfg_.model.moe.n_experts, local, experts, *groups_.ep, ops_);
  }
  return gather_tensor_parallel(*stage_table_, local, *groups_.tp, ops_);
}

int64_t Trainer::val_batches() const {
  check(val_data_ != nullptr, "val_batches() needs data.val");
  const uint64_t batch_tokens = static_cast<uint64_t>(cfg_.batch.micro_batch_size) * cfg_.batch.seq_len;
  const uint64_t available = val_data_->total_tokens() - 1;  // the last token is only a target
  const uint64_t wanted = cfg_.data.val_tokens > 0 ? static_cast<uint64_t>(cfg_.data.val_tokens) : available;
  return static_cast<int64_t>(std::max<uint64_t>(1, std::min(wanted, available) / batch_tokens));
}

bool Trainer::validates_after(int step) const {
  if (!val_data_) return false;
  const int every = cfg_.data.val_every_steps;
  const bool last = step == cfg_.schedule.total_steps;
  return (every > 0 && (step % every == 0 || last)) || (last && cfg_.data.final_val);
}

double Trainer::evaluate() {
  check(val_data_ != nullptr, "evaluate() needs data.val");
  const int B = cfg_.batch.micro_batch_size, T = cfg_.batch.seq_len;
  const uint64_t batch_tokens = static_cast<uint64_t>(B) * T;
  const int64_t batches = val_batches();
  // A long validation says how far it is (rank 0 speaks for the ranks, which run in step).
  const auto start = Clock::now();
  WorkProgress progress("val", "batches", batches);
  // DP rank d evaluates batches d, d + dp, ... Every rank runs the same number of forwards
  // (ZeRO-3 gathers parameters collectively), so a rank past the end repeats batch 0 unused.
  // With pp > 1 each batch goes through the pipeline's stages in turn; the last one has the loss.
  const int64_t dp = cfg_.parallel.dp, rounds = (batches + dp - 1) / dp;
  const bool reads = executor_->has_embedding() || executor_->has_head();
  double sums[2] = {0, 0};  // loss sum, tokens
  for (int64_t round = 0; round < rounds; round++) {
    const int64_t i = round * dp + coord_.dp;
    const bool counted = i < batches;
    if (reads) read_batch(*val_data_, 0, (counted ? i : 0) * B, -1, inputs_.data(), targets_.data());
    const double loss = executor_->forward_only(inputs_.data(), targets_.data());
    if (world_.rank == 0)
      if (const auto line = progress.update(std::min((round + 1) * dp, batches), seconds_since(start)))
        print_line(Stream::out, *line);
    if (!counted || !executor_->has_head()) continue;
    sums[0] += loss;
    sums[1] += static_cast<double>(batch_tokens) / cfg_.parallel.cp;  // each cp rank holds its part
  }
  groups_.dp_cp->all_reduce(sums, 2);
  if (cfg_.parallel.pp > 1) groups_.pp->all_reduce(sums, 2);
  return sums[0] / sums[1];
}

std::string Trainer::save_checkpoint() {
  // Writing may take long on a slow file system; that is not a hung step. It has a limit of its
  // own, so a rank lost while the others wait in the save's agreements still ends the run.
  const ProgressWatchdog::LongWork save(watchdog_.get(), "the save of the checkpoint of step " + std::to_string(step_),
                                        cfg_.checkpoint.save_timeout_s, "checkpoint.save_timeout_s");
  const auto t0 = Clock::now();
  const std::string path = ckpt_->save({step_, cursor_, guard_->record()}, *store_, ops_, train_tokens());
  guard_->saved();
  const double seconds = seconds_since(t0);
  time_.checkpoint += seconds;
  time_.checkpoints++;
  if (world_.rank == 0) print_linef(Stream::out, "checkpoint| step %d saved to %s (%.2f s)", step_, path.c_str(), seconds);
  return path;
}

std::string Trainer::final_checkpoint() const {
  return ckpt_->step_on_disk() == step_ ? ckpt_->path_on_disk() : std::string();
}

bool Trainer::checkpoint_if_due(bool run_finished) {
  // A signal may reach the ranks at different steps: they stop together when any has one.
  double stops = ckpt::stop_requested() ? 1.0 : 0.0;
  groups_.world->all_reduce(&stops, 1);
  const bool stop = stops > 0;
  // A run that finished its steps leaves its trained model (checkpoint.final, on by default):
  // the whole training state, so it can be sampled, exported, resumed or extended.
  const bool final_save = run_finished && cfg_.checkpoint.final;
  // Step 0 of a fresh run has nothing worth saving; a step already on disk (every_steps saved
  // it, or the run resumed from it) is not saved twice.
  if ((stop || final_save || ckpt_->due(step_)) && step_ > 0 && ckpt_->step_on_disk() != step_) save_checkpoint();
  if (stop && world_.rank == 0) {
    const int sig = ckpt::stop_signal();
    print_linef(Stream::out,
                "stopped   | %s after step %d/%d: the checkpoint of step %d is in %s; continue with --set "
                "checkpoint.resume=auto",
                sig ? ckpt::signal_name(sig) : "a signal to another rank", step_, cfg_.schedule.total_steps, step_,
                cfg_.checkpoint.dir.c_str());
  }
  return stop;
}

void Trainer::run() {
  const auto session_start = Clock::now();  // the report's wall time
  // From here on SIGTERM/SIGINT/SIGUSR1 stop the run after the current step, with a checkpoint
  // (on every rank together: see checkpoint_if_due).
  const ckpt::StopSignals stop_signals;
  // Rank 0 speaks for the run: the log, config.json, metrics.jsonl.
  const bool lead = world_.rank == 0;
  if (lead) {
    print_startup();
    std::filesystem::create_directories(cfg_.run.out_dir);
    write_resolved_config(cfg_);
  }

  // MFU needs a peak: configured, else the GPU table, else measured (the CPU backend).
  const auto& lg = cfg_.logging;
  double peak = lg.peak_tflops;
  std::string peak_source = "logging.peak_tflops";
  if (peak <= 0 && ops_.device() == Device::cuda) {
    peak = gpu_peak_tflops(ops_.device_description());
    peak_source = "device table";
  }
  if (peak <= 0 && lead) {  // only rank 0 reports MFU
    auto t0 = Clock::now();
    const PeakProbe probe = measure_matmul_peak(ops_);
    startup_lap("MFU probe", t0);
    peak = probe.tflops;
    peak_source = "measured: fp32 matmul " + std::to_string(probe.size) + "^3 on this device";
  }
  const double flops_tok = flops_per_token(table_, cfg_.model, cfg_.batch.seq_len, lg.flops_formula);
  const std::string flops_formula = flops_formula_description(table_, cfg_.model, lg.flops_formula);
  if (lead) print_linef(Stream::out, "mfu       | %s; peak %.4f TFLOP/s (%s)", flops_formula.c_str(), peak, peak_source.c_str());
  // FP8 products: MFU also against the FP8 peak (the CPU emulates FP8 with fp32 products, so its
  // FP8 peak is the measured fp32 one).
  double fp8_peak = 0;
  if (const Fp8Recipe fp8 = fp8_recipe(cfg_.precision); fp8.any()) {
    fp8_peak = ops_.device() == Device::cuda ? gpu_fp8_peak_tflops(ops_.device_description()) : peak;
    const std::vector<bool> gathered = fp8_gathered_params(store_->table(), cfg_);
    const bool fp8_gather = std::find(gathered.begin(), gathered.end(), true) != gathered.end();
    if (lead)
      print_linef(Stream::out, "fp8       | %s: the products of %s in FP8 (gradients %s)%s; mfu_fp8 = tflops_per_gpu / FP8 peak %s",
                  fp8.delayed ? format("delayed, amax history %d steps", fp8.amax_history).c_str()
                              : cfg_.precision.fp8.c_str(),
                  fp8_layer_list(fp8, ",").c_str(),
                  cfg_.precision.fp8_grad_format.c_str(), fp8_gather ? "; ZeRO-3 gathers their weights in FP8" : "",
                  fp8_peak > 0 ? format("%.4f TFLOP/s (%s)", fp8_peak,
                                        ops_.device() == Device::cuda ? "device table" : "the emulation's: the fp32 peak")
                                     .c_str()
                               : "unknown for this GPU (not in the table): not logged");
  }
  const auto& par = cfg_.parallel;
  if (lead && par.pp > 1)
    if (const auto w = pipeline_bubble_warning(parse_pipe_schedule(par.pp_schedule), par.pp, par.pp_virtual_stages,
                                               cfg_.batch.grad_accum_steps))
      print_warning(*w);
  if (lead && par.pp > 1 && lg.sample_every > 0)
    print_warning(format("logging.sample_every=%d: in-training samples need the whole model on one rank and are "
                         "skipped with parallel.pp=%d (sample from a checkpoint with `picotrain sample`)",
                         lg.sample_every, par.pp));

  const std::string metrics_path = (std::filesystem::path(cfg_.run.out_dir) / lg.metrics_file).string();
  // A resumed run continues its metrics file: the records up to the checkpoint's step are kept
  // (those after it belong to steps that are about to be redone) and new ones appended.
  std::optional<MetricsLog> log;
  if (lead) log.emplace(metrics_path, lg.flops_formula, ckpt_->resumed_from().empty() ? -1 : step_);
  const int total = cfg_.schedule.total_steps;
  const int first_step = step_;  // > 0 when resumed
  double timed_seconds = 0;  // steps after the first (which pays for warm-up)
  int timed_steps = 0;
  // The run report's record of the sessions (a fresh run starts a new one) and its MFU fields.
  std::optional<SessionLog> sessions;
  if (lead) {
    sessions.emplace((std::filesystem::path(cfg_.run.out_dir) / "sessions.jsonl").string(),
                     cfg_.checkpoint.resume == "none");
    sessions->start(step_, ckpt_->resumed_from());
  }
  RunSummary summary;
  summary.flops_per_token = flops_tok;
  summary.flops_formula = flops_formula;
  summary.peak_tflops = peak;
  summary.peak_source = peak_source;
  std::vector<Stall> step_ms;  // this session's step times: the report's stalls
  // The measured peak is training's: start-up's temporaries (the MFU probe's matrices) are gone.
  ops_.reset_peak_memory();

  // logging.sample_every: a text sample in the log (core/model/sample_run.h; collective under ZeRO-3).
  auto print_sample = [&](bool finished) {
    // The sampler needs the whole model on one rank; a pipeline stage holds only its layers.
    if (par.pp > 1) return;
    const auto t0 = Clock::now();
    auto sample = print_training_sample(cfg_, step_, finished, *store_, ops_, lead, [this] { return gather_master(); });
    if (finished) final_sample_ = std::move(sample);
    time_.sample += seconds_since(t0);
  };
  watchdog_ = start_rank_watchdog(cfg_.run.hang_timeout_s, world_);
  if (watchdog_ && lead) {
    const double save_s = cfg_.checkpoint.save_timeout_s;
    const std::string saves = save_s > 0 ? format("a checkpoint save after %.0f s (checkpoint.save_timeout_s)", save_s)
                                         : std::string("checkpoint saves never (checkpoint.save_timeout_s=0)");
    print_linef(Stream::out, "watchdog  | a rank without progress for %.0f s (or %gx its slowest step) ends the run "
                "(run.hang_timeout_s); %s", watchdog_->limit_s(), watchdog_->slow_factor(), saves.c_str());
  }
  start_matmul_algos();
  if (lead) print_startup_time();
  const double startup_s = seconds_since_process_start();
  bool stopped = false;
  bool mfu_warned = false;  // the MFU-above-100% warning, once a session
  while (step_ < total) {
    if (watchdog_) watchdog_->beat("step " + std::to_string(step_ + 1));
    if ((stopped = checkpoint_if_due(false))) break;  // for the step just done
    if (step_ > first_step) print_sample(false);
    const double comm_before = groups_.comm_stats->collective_seconds();
    const auto t0 = Clock::now();
    const StepResult r = step();
    ops_.synchronize();
    const double dt = seconds_since(t0);
    commit_matmul_algos();  // after the session's first step, when timing
    // Where the step's time went (the report): collectives, pipeline waits, data.
    const double comm = groups_.comm_stats->collective_seconds() - comm_before;
    time_.steps += dt;
    time_.comm += comm;
    time_.bubble += r.pp_wait_ms / 1e3;
    time_.data += step_data_s_;
    time_.step_count++;
    for (size_t p = 0; p < time_.phases.size(); p++) time_.phases[p] += r.phases.ms[p] / 1e3;
    step_ms.push_back({step_, dt * 1e3});
    // After the session's first step every buffer exists (activations, gradients, optimizer
    // state, ZeRO-2/3's working layers have come and gone): what rank 0 holds, next to its plan.
    if (step_ == first_step + 1 && lead) {
      const size_t plan = plan_stage_memory(cfg_, table_, ops_.compute_dtype())[coord_.pp].plan.total();
      summary.memory_measured = "step " + std::to_string(step_) + (world_.size > 1 ? " on rank 0" : "") + ": " +
                                describe_memory_use(ops_.memory_use(), plan);
      print_line(Stream::out, "memory    | " + summary.memory_measured);
    }
    // The first step after warm-up: where a step's time goes on the device (every logged step's
    // split is in metrics.jsonl, the session's in the report).
    if (step_ == first_step + 2 && lead)
      print_linef(Stream::out, "phases    | step %d, %.1f ms: %s", step_, dt * 1e3,
                  describe_phases(r.phases, dt * 1e3, step_data_s_ * 1e3).c_str());
    if (step_ > first_step + 1) {
      timed_seconds += dt;
      timed_steps++;
    }
    if (r.replayed) {
      summary.replay_checks++;
      summary.replay_s += r.replay_s;
      if (!r.replay_mismatches.empty()) {
        summary.replay_mismatches++;
        summary.guard_events.push_back(format("step %d: the corruption check's replay differed on %zu rank(s)", step_,
                                              r.replay_mismatches.size()));
      }
    }
    // A skipped step is counted (and may end the run); a spike rolls back to the newest
    // checkpoint, whose steps are then logged again.
    if (guard_step(r, summary)) {
      if (log) log.emplace(metrics_path, lg.flops_formula, step_);
      continue;
    }
    const double avg_dt = timed_steps > 0 ? timed_seconds / timed_steps : dt;

    const bool last = step_ == total;
    const bool do_val = validates_after(step_);
    const bool do_task = scores_task_after(step_);
    if (!do_val && !do_task && step_ % lg.every_steps != 0 && !last) continue;

    StepMetrics m;
    m.step = step_;
    m.total_steps = total;
    m.loss = r.loss;
    m.lr = r.lr;
    m.grad_norm = r.grad_norm;
    m.dt_ms = dt * 1e3;
    m.tokens_per_s = static_cast<double>(tokens_per_step()) / dt;
    m.tflops_per_gpu = flops_tok * m.tokens_per_s / world_.size / 1e12;
    m.mfu = m.tflops_per_gpu / peak;
    if (fp8_peak > 0) m.mfu_fp8 = m.tflops_per_gpu / fp8_peak;
    if (lead && m.mfu > 1 && !mfu_warned) {
      // No device computes faster than its peak: the peak is wrong, and every MFU with it.
      mfu_warned = true;
      print_warning(format("step %d ran at %.1f%% MFU, above 100%%: the peak of %.4g TFLOP/s (%s) is lower than this "
                           "device really reaches, so every MFU of this run reads high; set logging.peak_tflops to "
                           "the device's real peak", step_, 100 * m.mfu, peak, peak_source.c_str()));
    }
    m.tokens = tokens_per_step() * static_cast<uint64_t>(step_);
    m.eta_s = avg_dt * (total - step_);
    m.data_ms = step_data_s_ * 1e3;
    m.comm_ms = comm * 1e3;
    m.phases = r.phases;
    if (do_val) {
      if (watchdog_) watchdog_->beat("the validation after step " + std::to_string(step_));
      if (lead && last)
        print_linef(Stream::out, "val       | after the last step: %lld batches, %lld tokens (data.val_tokens=%lld%s)",
                    static_cast<long long>(val_batches()),
                    static_cast<long long>(val_batches()) * cfg_.batch.micro_batch_size * cfg_.batch.seq_len,
                    static_cast<long long>(cfg_.data.val_tokens), cfg_.data.val_tokens == 0 ? ": the whole split" : "");
      const auto te = Clock::now();
      m.val_loss = evaluate();
      time_.eval += seconds_since(te);
    }
    if (do_task) {
      if (watchdog_) watchdog_->beat("the scoring of eval.task after step " + std::to_string(step_));
      const auto te = Clock::now();
      const McScores scores = *score_eval_task();
      m.task = TaskAccuracy{eval_task_name(), scores.acc(), scores.acc_norm()};
      time_.eval += seconds_since(te);
    }
    if (par.pp > 1) {
      m.pp_bubble = r.pp_bubble;
      m.pp_wait_ms = r.pp_wait_ms;
    }
    if (cfg_.model.moe.enabled()) {
      m.moe_aux = r.moe_aux;
      m.moe_max_load = r.moe_max_load;
    }
    if (guard_->record().skipped_steps > 0) m.skipped_steps = guard_->record().skipped_steps;
    if (log) log->log(m);
  }
  if (watchdog_) watchdog_->beat("the end of the run (final checkpoint, sample and report)");
  if (!stopped && !(stopped = checkpoint_if_due(true))) print_sample(true);
  time_.wall = seconds_since(session_start);
  const auto report_start = Clock::now();
  write_session_report(std::move(summary), step_ms, sessions ? &*sessions : nullptr, metrics_path);
  const double report_s = seconds_since(report_start);
  watchdog_.reset();
  if (lead && !stopped) {
    // Where the whole process's time went: the steps, and each part outside them.
    const double total_s = seconds_since_process_start();
    const double outside = startup_s + time_.eval + time_.sample + time_.checkpoint + report_s;
    const std::string model = final_checkpoint();
    print_linef(Stream::out,
                "done      | %d steps in %s: start-up %.1f s, steps %.1f s, validation %.1f s, samples %.1f s, "
                "checkpoints %.1f s, report %.1f s, other %.1f s; metrics in %s; %s",
                step_ - first_step, format_duration(total_s).c_str(), startup_s, time_.steps, time_.eval, time_.sample,
                time_.checkpoint, report_s, std::max(0.0, total_s - outside - time_.steps), metrics_path.c_str(),
                model.empty() ? "no final checkpoint (checkpoint.final=false)" : ("final checkpoint " + model).c_str());
  }
}

}  // namespace pt
