#include "core/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "core/ckpt/stop_signal.h"
#include "core/common/build_info.h"
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

// Adds the time since `t0` to `parts` under `part` and restarts `t0`: start-up's account.
void lap(std::vector<std::pair<std::string, double>>& parts, const char* part, Clock::time_point& t0) {
  const auto now = Clock::now();
  parts.emplace_back(part, std::chrono::duration<double>(now - t0).count());
  t0 = now;
}
}  // namespace

Trainer::Trainer(const RunConfig& cfg, const World& world, Ops& ops)
    : cfg_(cfg), world_(world), ops_(ops), table_(build_param_table(cfg.model)), timeline_(ops) {
  // Everything a rank can check and set up alone comes first. If it fails on any rank, every
  // rank throws here, before a first collective could leave the others waiting.
  std::exception_ptr failure;
  try {
    setup_local();
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_startup(world, failure);

  auto t0 = Clock::now();
  groups_ = make_process_groups(*grid_, world, ops, cfg.parallel.comm_backend);  // collective over the world
  lap(startup_parts_, "communicators", t0);
  if (cfg.parallel.pp > 1) norm_scope_.pipeline = groups_.pp.get();
  if (cfg.parallel.tp > 1) norm_scope_.tensor = groups_.tp.get();

  // checkpoint.resume: overwrites the initial weights, step and cursor when it names a
  // checkpoint. Each rank reads the pieces of its own layout, whatever layout wrote them; the
  // ranks agree on which checkpoint (and fail together). A shard held by several ranks (HSDP
  // replicas, ZeRO-0's dp ranks) is saved by the first of them only.
  const std::vector<int> holders =
      cfg.parallel.zero_stage == 0 ? grid_->dp_cp_group(world.rank) : grid_->dp_replicate_group(world.rank);
  ckpt_->set_ranks(groups_.world.get(), holders.front() == world.rank);
  // Everything below allocates (ZeRO-2/3's reduced piece, the activations): running out of
  // memory on one rank must reach agree_on_startup like any other failure, or the others would
  // wait in its collective for a rank that has already left.
  try {
    gather_ = std::make_unique<ParamGather>(*store_, ops, *groups_.shard);
    grad_sync_ = std::make_unique<GradSync>(*store_, ops, *groups_.dp_cp, *groups_.shard, *groups_.replicate);
    hooks_ = std::make_unique<ZeroHooks>(*gather_, *grad_sync_);
    std::vector<GradSync*> syncs = {grad_sync_.get()};
    if (expert_store_) {
      expert_gather_ = std::make_unique<ParamGather>(*expert_store_, ops, *groups_.expert_shard);
      expert_sync_ = std::make_unique<GradSync>(*expert_store_, ops, *groups_.expert_dp_cp, *groups_.expert_shard,
                                                *groups_.replicate);
      hooks_->add(*expert_gather_, *expert_sync_, expert_store_->layout());
      syncs.push_back(expert_sync_.get());
      expert_optim_.store = expert_store_.get();
      expert_optim_.shard_group = groups_.expert_shard.get();
      expert_optim_.ep_group = groups_.ep.get();
    }
    // The model's chunks run over the tensor- and context-parallel groups: built now that they exist.
    ModelParallel mp;
    mp.tp = groups_.tp.get();
    mp.sequence_parallel = cfg.parallel.sequence_parallel;
    mp.cp = groups_.cp.get();
    mp.cp_impl = parse_cp_impl(cfg.parallel.cp_impl);
    mp.ep = groups_.ep.get();
    mp.experts = expert_store_.get();
    executor_ = std::make_unique<PipelineExecutor>(cfg, coord_.pp, *store_, ops, mp);
    executor_->connect(*groups_.pp, groups_.embedding.get());
    executor_->set_grad_runtime(hooks_.get(), syncs);
    lap(startup_parts_, "model", t0);
    guard_ = std::make_unique<RunGuard>(cfg.run);
    if (const auto st = ckpt_->restore(*store_, ops, train_data_->total_tokens())) {
      step_ = st->step;
      cursor_ = st->cursor;
      guard_ = std::make_unique<RunGuard>(cfg.run, st->health);
      lap(startup_parts_, "resume", t0);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_startup(world, failure);
  // From here a failure on one rank must end them all (main.cpp aborts the world).
  set_ranks_in_lockstep(world.size > 1);
}

void Trainer::setup_local() {
  const RunConfig& cfg = cfg_;
  Ops& ops = ops_;
  // The backend was made for the configured dtype (main.cpp); a mismatch is a caller's bug
  // that would silently train in the wrong precision.
  const std::string& want = cfg.precision.compute_dtype;
  const char* have = ops.compute_dtype() == DType::bf16 ? "bf16" : "fp32";
  if (want != "auto" && want != have)
    throw ConfigError("precision.compute_dtype=" + want + " but the " + device_name(ops.device()) +
                      " backend computes in " + have);
  const auto& par = cfg.parallel;
  grid_ = std::make_unique<Grid>(par);
  check(grid_->world_size() == world_.size, "the layout has " + std::to_string(grid_->world_size()) +
                                                " ranks but the world " + std::to_string(world_.size));
  coord_ = grid_->coord(world_.rank);

  // ZeRO shards over the dp_shard x cp ranks of this rank's replica (all of dp x cp without HSDP).
  const std::vector<int> shard_group = grid_->dp_shard_group(world_.rank);
  const int shard_rank = static_cast<int>(std::find(shard_group.begin(), shard_group.end(), world_.rank) - shard_group.begin());
  // Pipeline parallel: this rank holds only its stage's parameters (the whole table when pp == 1),
  // tensor parallel only its tp rank's pieces of them, sharded by ZeRO over the stage's own
  // dp x cp group.
  const std::vector<StageLayers> chunks = pipeline_chunks(cfg.model, par, coord_.pp);
  stage_table_ = std::make_unique<ParamTable>(
      tensor_parallel_table(stage_param_table(table_, chunks, cfg.model.n_layers), par.tp, coord_.tp));
  // Expert parallel: this rank holds the dense part of its stage and its own routed experts, in
  // two stores, the experts' sharded over the ranks that hold the same ones.
  if (par.ep > 1) {
    ExpertSplit split = split_expert_parallel(*stage_table_, cfg.model.moe.n_experts, par.ep, coord_.dp % par.ep);
    dense_table_ = std::make_unique<ParamTable>(std::move(split.dense));
    expert_table_ = std::make_unique<ParamTable>(std::move(split.experts));
  }
  const ParamTable& stage_table = dense_table_ ? *dense_table_ : *stage_table_;  // what store_ holds
  const size_t bucket_cap = bucket_cap_elements(par.grad_bucket_mb);
  const ShardLayout layout(stage_table, par.zero_stage, static_cast<int>(shard_group.size()), shard_rank, bucket_cap);
  auto t0 = Clock::now();
  store_ = std::make_unique<ParamStore>(stage_table, layout, ops);
  if (expert_table_) {
    const std::vector<int> group = grid_->expert_shard_group(world_.rank);
    const int at = static_cast<int>(std::find(group.begin(), group.end(), world_.rank) - group.begin());
    const ShardLayout experts(*expert_table_, par.zero_stage, static_cast<int>(group.size()), at, bucket_cap);
    expert_store_ = std::make_unique<ParamStore>(*expert_table_, experts, ops);
  }
  lap(startup_parts_, "buffers", t0);
  for (ParamStore* store : {store_.get(), expert_store_.get()}) {
    if (!store) continue;
    // Not a std::vector: init_params writes every element, and zero-filling half a gigabyte first
    // (GPT-2 124M) was a second pass over it on one core.
    const std::unique_ptr<float[]> host(new float[store->table().total_numel()]);
    init_params(store->table(), cfg.run.seed, host.get());
    store->load_master(host.get());
  }
  lap(startup_parts_, "weights", t0);

  const int B = cfg.batch.micro_batch_size, T = cfg.batch.seq_len;
  train_data_ = std::make_unique<DataLoader>(cfg.data.train, cfg.model.vocab_size, B, T);
  if (!cfg.data.val.empty()) val_data_ = std::make_unique<DataLoader>(cfg.data.val, cfg.model.vocab_size, B, T);
  lap(startup_parts_, "data", t0);
  // Context parallel: each rank keeps its part of every sequence it reads (T / cp tokens).
  cp_split_ = std::make_unique<CpSplit>(cp_split_kind(parse_cp_impl(par.cp_impl)), T, par.cp);
  const size_t step_tokens = static_cast<size_t>(cfg.batch.grad_accum_steps) * B * (T / par.cp);
  inputs_.resize(step_tokens);
  targets_.resize(step_tokens);

  // Counted in the gradient norm and saved once: the LM head's copy of the tied wte (the last
  // stage, pp > 1) is not (the first stage's copy is, and both are equal), nor are replicated
  // parameters on tp ranks other than 0 (every tp rank holds the same values).
  std::vector<bool> held_elsewhere;
  for (const ParamSpec& p : stage_table.specs())
    held_elsewhere.push_back(is_tied_copy(p, chunks) || (coord_.tp > 0 && p.tp.whole()));
  ckpt_ = std::make_unique<ckpt::Checkpointer>(cfg, stage_table);
  if (std::find(held_elsewhere.begin(), held_elsewhere.end(), true) != held_elsewhere.end()) {
    norm_scope_.not_counted = held_elsewhere;
    ckpt_->set_not_saved(held_elsewhere);
  }
  if (expert_store_) {
    // The routed experts are whole on every tp rank: counted and saved on tp rank 0. Of the ranks
    // holding the same expert shard (all of them under ZeRO-0, the HSDP replicas otherwise) the
    // first saves it.
    const std::vector<bool> tp_copy(expert_table_->specs().size(), coord_.tp > 0);
    const std::vector<int> holders = par.zero_stage == 0 ? grid_->expert_dp_cp_group(world_.rank)
                                                         : grid_->dp_replicate_group(world_.rank);
    ckpt_->set_experts(*expert_store_, holders.front() == world_.rank,
                       coord_.tp > 0 ? tp_copy : std::vector<bool>{});
    if (coord_.tp > 0) expert_optim_.not_counted = tp_copy;
  }
}

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
  const int B = cfg_.batch.micro_batch_size, T = cfg_.batch.seq_len;
  const int accum = cfg_.batch.grad_accum_steps, dp = cfg_.parallel.dp, pp = cfg_.parallel.pp;
  // The loss is the token-weighted mean over the whole global batch, so each token's
  // gradient is scaled by 1 / (tokens in the global batch), whatever the split.
  const double batch_tokens = static_cast<double>(sequences_per_step()) * T;
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
  const float step_dloss = faults_.nan_gradient.erase(this_step) ? std::nanf("") : dloss;
  PipelineStepStats ps = executor_->train_step(inputs_.data(), targets_.data(), step_dloss, &timeline_);
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
  for (int c = 0; c < static_cast<int>(executor_->chunks().size()); c++) {
    const MoeStats m = executor_->chunk(c).take_moe_stats();
    moe.aux_sum += m.aux_sum;
    moe.max_load_sum += m.max_load_sum;
    moe.layer_batches += m.layer_batches;
  }
  double sums[5] = {ps.loss_sum, ps.tokens, moe.aux_sum, moe.max_load_sum, moe.layer_batches};
  groups_.dp_cp->all_reduce(sums, 5);  // the token-weighted mean over dp x cp
  cursor_ = (cursor_ + static_cast<uint64_t>(sequences_per_step()) * T) % train_data_->total_tokens();
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
                                      norm_scope_, expert_store_ ? &expert_optim_ : nullptr, nonfinite);
  r.skipped = !s.updated;
  if (r.skipped) r.skip_ends_run = guard_->record_skip();
  else guard_->record_update();
  if (!r.skipped) {
    gather_->gather_updated();  // ZeRO-1/2: every rank's updated piece back into the full params
    if (expert_gather_) expert_gather_->gather_updated();
  }
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
  return r;
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

void Trainer::print_startup() const {
  const auto& m = cfg_.model;
  const auto& b = cfg_.batch;
  const auto out = Stream::out;
  print_linef(out, "picotrain | run %s -> %s", cfg_.run.name.c_str(), cfg_.run.out_dir.c_str());
  print_linef(out, "build     | %s", build_description().c_str());
  print_linef(out, "device    | %s", ops_.device_description().c_str());
  if (world_.size > 1)
    print_linef(out, "comm      | %s: %s", comm_backend_name(groups_.backend.backend), groups_.backend.reason.c_str());
  print_linef(out, "model     | %s: %d layers, d_model %d, %d heads, vocab %d (padded %d), max_seq_len %d, %.2fM params",
              m.arch.c_str(), m.n_layers, m.d_model, m.n_heads, m.vocab_size, m.padded_vocab, m.max_seq_len,
              table_.total_numel() / 1e6);
  print_linef(out, "batch     | %d x %d tokens per micro-batch, %d accumulation steps, %lld tokens per step",
              b.micro_batch_size, b.seq_len, b.grad_accum_steps, static_cast<long long>(sequences_per_step() * b.seq_len));
  // The layout: degrees, every rank's coordinates and the groups (compact, long lists elided).
  const std::string layout = grid_->describe();
  for (size_t at = 0, n = 0; at < layout.size(); n++) {
    const size_t end = std::min(layout.find('\n', at), layout.size());
    print_linef(out, "%s| %s", n == 0 ? "layout    " : "          ", layout.substr(at, end - at).c_str());
    at = end + 1;
  }
  print_linef(out, "          | ZeRO-%d, gradients reduced in %zu bucket(s) of <= %g MiB%s", store_->layout().zero_stage(),
              store_->layout().buckets().size(), cfg_.parallel.grad_bucket_mb,
              store_->layout().zero_stage() >= 2 ? " (one layer each under ZeRO-2/3)" : "");
  if (expert_store_) {
    const int E = cfg_.model.moe.n_experts, ep = cfg_.parallel.ep, first = coord_.dp % ep * (E / ep);
    print_linef(out, "          | expert parallel: each rank holds %d of %d routed experts (this one %d-%d, %.2fM params), "
                "their gradients reduced over %d rank(s) and ZeRO-sharded over %d",
                E / ep, E, first, first + E / ep - 1, expert_table_->total_numel() / 1e6, groups_.expert_dp_cp->size(),
                expert_store_->layout().shard_count());
  }
  const auto& par = cfg_.parallel;
  const Recompute recompute = parse_recompute(cfg_.recompute.mode);
  if (par.pp > 1) {
    const PipeSchedule kind = parse_pipe_schedule(par.pp_schedule);
    std::string line = format("pipeline  | %s over pp %d", par.pp_schedule.c_str(), par.pp);
    if (par.pp_virtual_stages > 1) line += format(" x %d virtual stages", par.pp_virtual_stages);
    // The step line measures the bubble as a fraction of the step; the formula gives both.
    line += format(", %d micro-batches per step; bubble by the formula %.1f%% of compute time, %.1f%% of the step",
                   b.grad_accum_steps, 100.0 * pipeline_bubble_ratio(kind, par.pp, par.pp_virtual_stages, b.grad_accum_steps),
                   100.0 * pipeline_bubble_fraction(kind, par.pp, par.pp_virtual_stages, b.grad_accum_steps));
    print_line(out, line);
  }
  // Every rank of a pipeline stage holds the same bytes (shards are padded to equal sizes); the
  // stages differ, so each gets a line, from the shapes alone (what `picotrain plan` prints).
  for (const StageMemory& st : plan_stage_memory(cfg_, table_, ops_.compute_dtype())) {
    if (par.pp > 1) print_linef(out, "stage %-4d| %s", st.pp_rank, st.chunks.c_str());
    print_linef(out, "memory    | %s%s, recompute %s",
                world_.size > 1 ? (par.pp > 1 ? "per rank of this stage, " : "per rank (all ranks equal), ") : "",
                st.plan.describe().c_str(), to_string(recompute));
  }
  std::string data = format("data      | train %zu file(s), %llu tokens", train_data_->files().size(),
                            static_cast<unsigned long long>(train_data_->total_tokens()));
  if (val_data_) {
    data += format("; val %zu file(s), %llu tokens", val_data_->files().size(),
                   static_cast<unsigned long long>(val_data_->total_tokens()));
    const int every = cfg_.data.val_every_steps;
    const long long tokens = static_cast<long long>(val_batches()) * b.micro_batch_size * b.seq_len;
    if (every > 0) data += format(", validating on %lld every %d steps and after the last", tokens, every);
    else if (cfg_.data.final_val) data += format(", validating on %lld after the last step (data.final_val)", tokens);
    else data += " unused (data.val_every_steps=0 and data.final_val=false)";
  }
  print_line(out, data);
  const auto& ck = cfg_.checkpoint;
  std::string ckpt =
      format("checkpoint| %s into %s, keeping the newest %d", ck.cadence().c_str(), ck.dir.c_str(), ck.keep_latest);
  if (ck.keep_every > 0) ckpt += format(" and every multiple of %d", ck.keep_every);
  if (!ckpt_->resumed_from().empty())
    ckpt += format("; resumed at step %d from %s", step_, ckpt_->resumed_from().c_str());
  print_line(out, ckpt);
}

std::string Trainer::save_checkpoint() {
  // Writing may take long on a slow file system; that is not a hung step. It has a limit of its
  // own, so a rank lost while the others wait in the save's agreements still ends the run.
  const ProgressWatchdog::LongWork save(watchdog_.get(), "the save of the checkpoint of step " + std::to_string(step_),
                                        cfg_.checkpoint.save_timeout_s, "checkpoint.save_timeout_s");
  const auto t0 = Clock::now();
  const std::string path = ckpt_->save({step_, cursor_, guard_->record()}, *store_, ops_, train_data_->total_tokens());
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
    lap(startup_parts_, "MFU probe", t0);
    peak = probe.tflops;
    peak_source = "measured: fp32 matmul " + std::to_string(probe.size) + "^3 on this device";
  }
  const double flops_tok = flops_per_token(table_, cfg_.model, cfg_.batch.seq_len, lg.flops_formula);
  const std::string flops_formula = flops_formula_description(table_, cfg_.model, lg.flops_formula);
  if (lead) print_linef(Stream::out, "mfu       | %s; peak %.4f TFLOP/s (%s)", flops_formula.c_str(), peak, peak_source.c_str());
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
  const double tokens_per_step = static_cast<double>(sequences_per_step()) * cfg_.batch.seq_len;
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
    if (!do_val && step_ % lg.every_steps != 0 && !last) continue;

    StepMetrics m;
    m.step = step_;
    m.total_steps = total;
    m.loss = r.loss;
    m.lr = r.lr;
    m.grad_norm = r.grad_norm;
    m.dt_ms = dt * 1e3;
    m.tokens_per_s = tokens_per_step / dt;
    m.tflops_per_gpu = flops_tok * m.tokens_per_s / world_.size / 1e12;
    m.mfu = m.tflops_per_gpu / peak;
    if (lead && m.mfu > 1 && !mfu_warned) {
      // No device computes faster than its peak: the peak is wrong, and every MFU with it.
      mfu_warned = true;
      print_warning(format("step %d ran at %.1f%% MFU, above 100%%: the peak of %.4g TFLOP/s (%s) is lower than this "
                           "device really reaches, so every MFU of this run reads high; set logging.peak_tflops to "
                           "the device's real peak", step_, 100 * m.mfu, peak, peak_source.c_str()));
    }
    m.tokens = static_cast<uint64_t>(tokens_per_step) * step_;
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

void Trainer::print_startup_time() const {
  const double total = seconds_since_process_start();
  std::string line = format("start-up  | %.1f s since the process started:", total);
  double parts = 0;
  for (const auto& [part, s] : startup_parts_) {
    line += format(" %s %.2f s,", part.c_str(), s);
    parts += s;
  }
  line += format(" other %.2f s (MPI, config, backend, log)", std::max(0.0, total - parts));
  print_line(Stream::out, line);
}

}  // namespace pt
