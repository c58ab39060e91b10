// The trainer's start-up: construction (each rank's local set-up, then the communicators, the
// model and the resume, with every rank agreeing on failures), the start-up report of the log,
// and start-up's time account. The training loop is in trainer.cpp.
#include <algorithm>
#include <chrono>

#include "core/common/build_info.h"
#include "core/common/console.h"
#include "core/metrics/process_clock.h"
#include "core/model/expert_split.h"
#include "core/model/model_tokenizer.h"
#include "core/plan/stage_memory.h"
#include "core/train/cuda_graphs.h"
#include "core/train/memory_plan.h"
#include "core/train/pp_bubble.h"
#include "core/train/trainer.h"

namespace pt {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

void Trainer::startup_lap(const char* part, std::chrono::steady_clock::time_point& t0) {
  const auto now = std::chrono::steady_clock::now();
  startup_parts_.emplace_back(part, std::chrono::duration<double>(now - t0).count());
  t0 = now;
}

Trainer::Trainer(const RunConfig& cfg, const World& world, Ops& ops)
    : cfg_(cfg), world_(world), ops_(ops), table_(build_param_table(cfg.model)), timeline_(ops), optim_graphs_(ops) {
  if (cfg.run.cuda_graphs) graphs_blocker_ = cuda_graphs_blocker(cfg, ops.device());
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
  startup_lap("communicators", t0);
  if (cfg.parallel.pp > 1) norm_scope_.pipeline = groups_.pp.get();
  if (cfg.parallel.tp > 1) norm_scope_.tensor = groups_.tp.get();

  // checkpoint.resume: sets the weights, step and cursor when it names a
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
    gather_->enable_fp8(fp8_gathered_params(store_->table(), cfg), *groups_.tp);
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
    mp.dp_cp = groups_.dp_cp.get();
    mp.experts = expert_store_.get();
    executor_ = std::make_unique<PipelineExecutor>(cfg, coord_.pp, *store_, ops, mp);
    executor_->connect(*groups_.pp, groups_.embedding.get());
    executor_->set_grad_runtime(hooks_.get(), syncs);
    // Delayed FP8 scaling's histories are checkpoint state: the same on every rank of a stage,
    // saved by its first (dp, tp and cp rank 0).
    if (const Fp8Recipe fp8 = fp8_recipe(cfg.precision); fp8.any() && fp8.delayed) {
      std::vector<DecoderStage*> chunks;
      for (size_t c = 0; c < executor_->chunks().size(); c++) chunks.push_back(&executor_->chunk(static_cast<int>(c)));
      fp8_history_ = std::make_unique<Fp8HistoryState>(chunks, fp8);
      ckpt_->set_extra_state(fp8_history_.get(), coord_.dp == 0 && coord_.tp == 0 && coord_.cp == 0);
    }
    startup_lap("model", t0);
    guard_ = std::make_unique<RunGuard>(cfg.run);
    // A checkpoint overwrites every master weight (Checkpointer::load reads each tensor of the
    // table whole), so the initial weights are drawn only when there is none to resume from.
    if (const auto st = ckpt_->restore(*store_, ops, train_tokens())) {
      step_ = st->step;
      cursor_ = st->cursor;
      guard_ = std::make_unique<RunGuard>(cfg.run, st->health);
      startup_lap("resume", t0);
    } else {
      init_weights();
      startup_lap("weights", t0);
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
  // data.tokenizer must fit the model. Checked by the first rank alone, which loads it anyway to
  // print samples (shared_tokenizer keeps the copy); a failure here stops every rank.
  if (world_.rank == 0 && !cfg.data.tokenizer.empty())
    check_tokenizer_fits(*shared_tokenizer(cfg.data.tokenizer), cfg.model.vocab_size,
                         "data.tokenizer=" + cfg.data.tokenizer);
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
  startup_lap("buffers", t0);

  const int B = cfg.batch.micro_batch_size, T = cfg.batch.seq_len;
  // An evaluation-only trainer (`picotrain eval`, core/eval/eval_command.h) reads no training data.
  if (!cfg.data.train.empty()) train_data_ = std::make_unique<DataLoader>(cfg.data.train, cfg.model.vocab_size, B, T);
  if (!cfg.data.val.empty()) val_data_ = std::make_unique<DataLoader>(cfg.data.val, cfg.model.vocab_size, B, T);
  load_eval_task();  // eval.task: read and tokenized by every rank alike
  startup_lap("data", t0);
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


void Trainer::init_weights() {
  for (ParamStore* store : {store_.get(), expert_store_.get()}) {
    if (!store) continue;
    // Not a std::vector: init_params writes every element, and zero-filling half a gigabyte first
    // (GPT-2 124M) was a second pass over it on one core.
    const std::unique_ptr<float[]> host(new float[store->table().total_numel()]);
    init_params(store->table(), cfg_.run.seed, host.get());
    store->load_master(host.get());
  }
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
              b.micro_batch_size, b.seq_len, b.grad_accum_steps, static_cast<long long>(tokens_per_step()));
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
  if (cfg_.run.cuda_graphs)
    print_line(out, graphs_blocker_.empty()
                        ? std::string("graphs    | run.cuda_graphs: each micro-batch's forward and backward, and the "
                                      "optimizer's update, recorded in the session's second step and replayed after") +
                              (cfg_.parallel.dp > 1 ? " (the last micro-batch's op by op: the gradient reductions "
                                                      "start inside its backward)"
                                                    : "")
                        : "graphs    | run.cuda_graphs is set, but " + graphs_blocker_);
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
  if (eval_task_) {
    const McLayout& t = *eval_task_;
    const std::string when = cfg_.eval.every_steps > 0
                                 ? format("every %d steps and after the last", cfg_.eval.every_steps)
                                 : std::string("after the last step");
    print_linef(out, "eval      | %s as %s_acc/_acc_norm %s: %zu examples (%lld skipped: an ending longer than "
                "batch.seq_len; %lld with the context cut from the left)",
                cfg_.eval.task.c_str(), eval_task_name().c_str(), when.c_str(), t.first_row.size(),
                static_cast<long long>(t.skipped), static_cast<long long>(t.truncated));
  }
  const auto& ck = cfg_.checkpoint;
  std::string ckpt =
      format("checkpoint| %s into %s, keeping the newest %d", ck.cadence().c_str(), ck.dir.c_str(), ck.keep_latest);
  if (ck.keep_every > 0) ckpt += format(" and every multiple of %d", ck.keep_every);
  if (!ckpt_->resumed_from().empty())
    ckpt += format("; resumed at step %d from %s", step_, ckpt_->resumed_from().c_str());
  print_line(out, ckpt);
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
