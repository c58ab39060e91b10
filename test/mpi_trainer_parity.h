// The harness of the layout-parity tests (mpi_pipeline.cpp, mpi_model_parallel.cpp): a tiny
// GPT-2 trained for a few steps under some layout (dp, tp with or without sequence parallel,
// pp with a schedule, cp ring or Ulysses, ZeRO, recompute) must follow the one-rank run: the loss
// and gradient norm of every step, the validation loss and the final weights agree within 1e-5
// relative.
//
// `train` runs on the CPU by default; the GPU layout tests (mpi_gpu_parity.cpp) pass Device::cuda.
//
// The model: 8 blocks (pp4 x 2 virtual stages), d_model 16, 4 heads (tp 4, or tp 2 x cp 2 under
// Ulysses), vocabulary 96 padded to 128 (under tp 4 the last rank's rows are all padding);
// 16 sequences of 8 tokens per step (cp 4 ring: 8 chunks of one token).
#pragma once
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
#include "core/model/architecture.h"
#include "core/plan/stage_memory.h"
#include "core/train/memory_plan.h"
#include "core/train/trainer.h"
#include "mpi_test_support.h"
#include "relative_error.h"

namespace pt::test {

constexpr int kSteps = 10, kB = 2, kT = 8, kSequencesPerStep = 16, kVocab = 96;

struct Layout {
  int pp = 1, dp = 1, tp = 1, cp = 1, v = 1, zero = 0;
  bool sp = false;
  std::string cp_impl = "ring";
  std::string schedule = "1f1b";
  std::vector<int> pp_layers;
  std::string recompute = "none";
  std::string checkpoints;  // checkpoint.dir ("" : unused)
  std::string resume = "none";
  std::string comm_backend = "auto";  // parallel.comm_backend
  // The model: "gpt2", or "llama" with n_kv_heads (grouped-query attention) and tie_embeddings.
  std::string arch = "gpt2";
  int kv_heads = 2;
  bool tied = false;
  double lr = 1e-2;
  // Mixture of experts (llama only): n_experts routed experts, top_k each, in every
  // moe_every-th block, with n_shared shared experts; 0 experts: dense.
  int experts = 0, top_k = 2, moe_every = 1, shared = 0;
  int ep = 1;  // expert parallel: ep of the dp ranks split the experts
  int dp_replicate = 1;  // HSDP: ZeRO shards within dp / dp_replicate ranks, replicated across
  std::string fp8 = "off";  // precision.fp8
  std::string fp8_layers = "all";  // precision.fp8_layers (with fp8 on)
  int fp8_history = 16;     // precision.fp8_amax_history (fp8 "delayed")
  bool fp8_gather = true;   // precision.fp8_weight_gather (ZeRO-3)
  bool cuda_graphs = false;  // run.cuda_graphs
  int ranks() const { return pp * dp * tp * cp; }

  // Variations, so that a test names each layout in one expression:
  //   check(grid(2, 2, 1).with_sp().with_zero(1))
  Layout with_sp() const { return with([](Layout& l) { l.sp = true; }); }
  Layout with_zero(int stage) const { return with([&](Layout& l) { l.zero = stage; }); }
  Layout with_ulysses() const { return with([](Layout& l) { l.cp_impl = "ulysses"; }); }
  Layout with_schedule(const std::string& s, int virtual_stages = 1) const {
    return with([&](Layout& l) { l.schedule = s, l.v = virtual_stages; });
  }
  Layout with_tied() const { return with([](Layout& l) { l.tied = true; }); }
  Layout with_ep(int n) const { return with([&](Layout& l) { l.ep = n; }); }
  Layout with_hsdp(int replicas) const { return with([&](Layout& l) { l.dp_replicate = replicas; }); }
  Layout with_fp8(const std::string& recipe = "tensorwise") const {
    return with([&](Layout& l) { l.fp8 = recipe; });
  }
  // Sparse blocks every `every`-th block, with `n_shared` shared experts.
  Layout with_moe_every(int every, int n_shared) const {
    return with([&](Layout& l) { l.moe_every = every, l.shared = n_shared; });
  }
  template <class F>
  Layout with(F change) const {
    Layout l = *this;
    change(l);
    return l;
  }

  // One line for a failure's context: the axes, and the model and options that differ from GPT-2's.
  std::string describe() const {
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s: dp %d x tp %d%s x cp %d (%s) x pp %d (%s, v %d), ZeRO-%d%s, recompute %s",
                  arch.c_str(), dp, tp, sp ? " + SP" : "", cp, cp_impl.c_str(), pp, schedule.c_str(), v, zero,
                  dp_replicate > 1 ? (", " + std::to_string(dp_replicate) + " HSDP replicas").c_str() : "",
                  recompute.c_str());
    std::string d = buf;
    if (fp8 != "off") d += ", FP8 " + fp8 + " on " + fp8_layers;
    if (arch != "gpt2") d += tied ? ", tied head" : ", untied head";
    if (experts > 0) {
      std::snprintf(buf, sizeof buf, ", %d experts (top %d, every %d block, %d shared, ep %d)", experts, top_k,
                    moe_every, shared, ep);
      d += buf;
    }
    return d;
  }
};

// dp x tp x cp x pp, the rest at its defaults (GPT-2, ring attention, 1F1B, ZeRO-0).
inline Layout grid(int dp, int tp, int cp, int pp = 1) {
  Layout l;
  l.dp = dp;
  l.tp = tp;
  l.cp = cp;
  l.pp = pp;
  return l;
}

inline RunConfig parity_config(const Layout& l, const std::filesystem::path& dir) {
  nlohmann::json j = {
      {"run", {{"name", "parity"}, {"out_dir", (dir / "run").string()}, {"seed", 11}, {"cuda_graphs", l.cuda_graphs}}},
      {"model", {{"n_layers", 8}, {"d_model", 16}, {"n_heads", 4}, {"vocab_size", kVocab}, {"pad_vocab_multiple", 64},
                 {"max_seq_len", 16}}},
      {"parallel", {{"pp", l.pp}, {"dp", l.dp}, {"tp", l.tp}, {"cp", l.cp}, {"sequence_parallel", l.sp},
                    {"cp_impl", l.cp_impl}, {"pp_schedule", l.schedule}, {"pp_virtual_stages", l.v},
                    {"pp_layers", l.pp_layers}, {"zero_stage", l.zero}, {"grad_bucket_mb", 0.002},
                    {"comm_backend", l.comm_backend}, {"ep", l.ep}, {"dp_replicate", l.dp_replicate}}},
      {"recompute", {{"mode", l.recompute}}},
      {"batch", {{"micro_batch_size", kB}, {"seq_len", kT}, {"global_batch_tokens", kSequencesPerStep * kT}}},
      {"optim", {{"lr", l.lr}, {"grad_clip", 0.5}}},  // clipping is active on these steps (GPT-2)
      {"schedule", {{"total_steps", kSteps}, {"warmup_steps", 2}}},
      {"data", {{"train", (dir / "p_train_*.bin").string()}, {"val", (dir / "p_val_*.bin").string()},
                {"val_tokens", 3 * kB * kT}}},
      {"checkpoint", {{"dir", l.checkpoints.empty() ? (dir / "unused").string() : l.checkpoints},
                      {"resume", l.resume}}},
  };
  if (l.fp8 != "off") j["precision"] = {{"fp8", l.fp8}, {"fp8_layers", l.fp8_layers}};
  if (l.fp8 == "delayed") j["precision"]["fp8_amax_history"] = l.fp8_history;
  if (!l.fp8_gather) j["precision"]["fp8_weight_gather"] = false;
  if (l.arch != "gpt2")
    j["model"].update({{"arch", l.arch}, {"n_kv_heads", l.kv_heads}, {"tie_embeddings", l.tied}});
  if (l.experts > 0)
    j["moe"] = {{"n_experts", l.experts}, {"top_k", l.top_k}, {"expert_hidden", 24}, {"every", l.moe_every},
                {"n_shared_experts", l.shared}, {"aux_loss_coef", 0.05}};
  return config_from_json(j, {}, l.ranks());
}

struct RunResult {
  std::vector<StepResult> steps;
  std::map<std::string, std::vector<float>> weights;  // this rank's stage's fp32 master weights, whole
  double val_loss = 0;
  int first_step = 0;  // > 0 when resumed
  long long graph_replays = 0;  // run.cuda_graphs: this rank's replayed forwards and backwards
};

inline RunResult collect(Trainer& t, int steps, bool evaluate = true) {
  RunResult r;
  r.first_step = t.steps_done();
  for (int s = 0; s < steps; s++) r.steps.push_back(t.step());
  r.graph_replays = t.pipeline().graph_replays();
  // gather_master: whole parameters (global shapes) in stage_table() order.
  const std::vector<float> w = t.gather_master();
  size_t at = 0;
  for (const auto& p : t.stage_table().specs()) {
    size_t n = 1;
    for (int64_t d : p.global_shape) n *= static_cast<size_t>(d);
    REQUIRE(at + n <= w.size());
    r.weights[p.name].assign(w.begin() + at, w.begin() + at + n);
    at += n;
  }
  CHECK(at == w.size());
  if (evaluate) r.val_loss = t.evaluate();
  return r;
}

// `device`: the backend the run trains on, always in fp32 (the CPU's precision), so a layout on
// the GPU is checked against one rank on the GPU with the same tolerance.
inline RunResult train(const Layout& l, const World& world, const std::filesystem::path& dir, int steps = kSteps,
                       Device device = Device::cpu) {
  const std::unique_ptr<Ops> ops = make_ops(device, DType::f32);
  Trainer t(parity_config(l, dir), world, *ops);
  return collect(t, steps);
}

// How closely a layout must follow one rank: losses (each step's and the validation loss), the
// gradient norms and the final weights, relative.
struct ParityBounds {
  double loss = 1e-5, grad_norm = 1e-5, weights = 1e-5;
};

// FP8 products (precision.fp8): a layout quantises with the same scales as one rank (the layer
// tests in mpi_tensor_parallel.cpp and mpi_fp8.cpp prove it exact, at the edges of the formats'
// range where the scales' groups matter), but the fp32 values it quantises differ in their last
// bits (sums in another order), and now and then such a difference moves a value across an FP8
// rounding boundary: one element then changes by an FP8 step, 1/8 to 1/4 of itself in e5m2
// gradients. The losses barely notice: up to 1.1e-5 relative in 10 steps (a validation loss
// under rowwise scales); gradient norms and, through Adam, weights move by up to 9e-4 (measured
// 2026-11-28 over the 2-rank layouts). What these bounds still catch is FP8 wiring that is
// wrong for a layout (an operand or a scale from the wrong rank: O(1) errors).
inline constexpr ParityBounds kFp8Bounds{3e-5, 3e-3, 3e-3};
// With the LM head in FP8 too (precision.fp8_layers = all,lm_head) a flip lands in the head's
// e5m2 logit gradients, which feed the loss most directly: up to 1.0e-4 relative (dp2, delayed
// scaling: steps 1-5 equal to 1e-9, then a flip at step 6; measured 2026-11-28); tp, cp and pp
// layouts stay under 3e-5.
inline constexpr ParityBounds kFp8HeadBounds{3e-4, 3e-3, 3e-3};
inline ParityBounds parity_bounds(const Layout& l) {
  if (l.fp8 == "off") return {};
  return l.fp8_layers.find("lm_head") == std::string::npos ? kFp8Bounds : kFp8HeadBounds;
}

// Losses and norms of the steps `got` ran; once it has reached the reference's last step, also
// the final weights and (when it evaluated) the validation loss.
inline void check_parity(const RunResult& got, const RunResult& want, bool check_val = true,
                         const ParityBounds& bound = {}) {
  for (size_t s = 0; s < got.steps.size(); s++) {
    const size_t ref = got.first_step + s;
    INFO("step " << ref + 1);
    REQUIRE(ref < want.steps.size());
    CHECK(got.steps[s].loss == Approx(want.steps[ref].loss).epsilon(bound.loss));
    CHECK(got.steps[s].grad_norm == Approx(want.steps[ref].grad_norm).epsilon(bound.grad_norm));
    CHECK(got.steps[s].lr == want.steps[ref].lr);
    // Mixture of experts: the balancing loss and the busiest expert's load (0 when dense).
    CHECK(got.steps[s].moe_aux == Approx(want.steps[ref].moe_aux).epsilon(1e-5));
    CHECK(got.steps[s].moe_max_load == Approx(want.steps[ref].moe_max_load).epsilon(1e-5));
  }
  if (got.first_step + got.steps.size() != want.steps.size()) return;
  std::vector<float> all, all_ref;  // every parameter this rank holds, and the reference's
  for (const auto& [name, w] : got.weights) {
    const std::vector<float>& ref = want.weights.at(name);
    REQUIRE(ref.size() == w.size());
    all.insert(all.end(), w.begin(), w.end());
    all_ref.insert(all_ref.end(), ref.begin(), ref.end());
  }
  CHECK(!got.weights.empty());
  CHECK(relative_l2(all, all_ref) < bound.weights);
  if (check_val) CHECK(got.val_loss == Approx(want.val_loss).epsilon(bound.loss));
}

// The tied embedding's two copies, on the first and the last stage of each pipeline, are equal
// bit for bit (their gradients are summed between the two ranks every step).
inline void check_tied_copies(const RunResult& r, const Layout& l, const World& world) {
  const int per_stage = l.tp * l.cp * l.dp;  // order tp-cp-dp-pp: pp varies slowest
  const int pp_coord = world.rank / per_stage;
  const bool first = pp_coord == 0, last = pp_coord == l.pp - 1;
  const Architecture arch = describe_architecture(parity_config(l, "unused").model);
  if (l.pp == 1 || (!first && !last) || !arch.tied_head) return;
  const int peer = first ? world.rank + (l.pp - 1) * per_stage : world.rank - (l.pp - 1) * per_stage;
  std::vector<float> mine = r.weights.at(arch.tensor_names(ParamRole::token_embedding, -1).at(0)), theirs(mine.size());
  MPI_Sendrecv(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, peer, 7, theirs.data(),
               static_cast<int>(theirs.size()), MPI_FLOAT, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  CHECK(mine == theirs);
}

// Trains `l`, which must fill the world, and checks it against `reference` (the one-rank run of
// the same model): check_parity, and the tied embedding's copies.
inline void check_trains_like(const Layout& l, const World& world, const std::filesystem::path& dir,
                              const RunResult& reference) {
  REQUIRE(l.ranks() == world.size);
  INFO(l.describe());
  const RunResult r = train(l, world, dir);
  check_parity(r, reference, true, parity_bounds(l));
  check_tied_copies(r, l, world);
}

// Activation recompute (selective, full) changes no bit of `l`'s run of `steps` steps.
inline void check_recompute_is_bitwise(Layout l, const World& world, const std::filesystem::path& dir, int steps) {
  l.recompute = "none";
  const RunResult none = train(l, world, dir, steps);
  for (const char* mode : {"selective", "full"}) {
    INFO("recompute " << mode);
    l.recompute = mode;
    const RunResult r = train(l, world, dir, steps);
    for (size_t s = 0; s < r.steps.size(); s++) {
      CHECK(r.steps[s].loss == none.steps[s].loss);
      CHECK(r.steps[s].grad_norm == none.steps[s].grad_norm);
    }
    CHECK(r.weights == none.weights);
  }
}

// What `l`'s stages allocate for activations equals decoder_activation_bytes' formula, under each
// recompute mode, and after a step (the tensor-parallel buffers have grown) this rank holds
// exactly its pipeline stage's memory plan (ZeRO-0: nothing is allocated and freed within the
// step; see test_zero.cpp).
inline void check_activation_memory(Layout l, const World& world, const std::filesystem::path& dir) {
  for (const char* mode : {"none", "selective", "full"}) {
    INFO("recompute " << mode);
    l.recompute = mode;
    const RunConfig cfg = parity_config(l, dir);
    CpuOps ops;
    Trainer t(cfg, world, ops);
    const auto& b = cfg.batch;
    const StageDims dims = StageDims::make(cfg.model, b.micro_batch_size, b.seq_len, l.tp, l.sp, l.cp, l.ep, l.dp * l.cp);
    PipelineExecutor& ex = t.pipeline();
    size_t want = pipeline_step_buffer_bytes(ex.chunks(), b.grad_accum_steps, size_t(b.micro_batch_size) * (b.seq_len / l.cp));
    for (size_t c = 0; c < ex.chunks().size(); c++)
      want += decoder_activation_bytes(dims, parse_cp_impl(l.cp_impl), DType::f32, ex.chunks()[c], ex.slots()[c],
                                       parse_recompute(mode),
                                       fp8_recipe(cfg.precision));
    CHECK(ex.activation_bytes() == want);
    t.step();
    const int stage = world.rank / (l.tp * l.cp * l.dp);  // order tp-cp-dp-pp: pp varies slowest
    const size_t plan = plan_stage_memory(cfg, build_param_table(cfg.model), DType::f32).at(size_t(stage)).plan.total();
    CHECK(ops.memory_use().live == plan);
    CHECK(ops.memory_use().peak == plan);
  }
}

// The same model and training as `l` on one rank.
inline Layout one_rank(const Layout& l) {
  Layout one;
  one.arch = l.arch;
  one.kv_heads = l.kv_heads;
  one.tied = l.tied;
  one.lr = l.lr;
  one.experts = l.experts;
  one.top_k = l.top_k;
  one.moe_every = l.moe_every;
  one.shared = l.shared;
  one.fp8 = l.fp8;
  one.fp8_layers = l.fp8_layers;
  one.fp8_history = l.fp8_history;
  return one;
}

// Checkpoints reshard both ways between `l` (the whole world) and one rank, on the reference
// trajectory: `l` saves at step 5 and rank 0 alone resumes it to the end; rank 0 alone saves at
// step 5 and `l` resumes it. Checkpoint directories are made under `dir`, named after `name`.
inline void check_reshard_with_one_rank(const Layout& l, const World& world, const std::filesystem::path& dir,
                                        const std::string& name, const RunResult& reference) {
  {
    Layout saver = l;
    saver.checkpoints = (dir / (name + "_to_1")).string();
    std::string saved;
    {
      CpuOps ops;
      Trainer t(parity_config(saver, dir), world, ops);
      check_parity(collect(t, 5, false), reference, false);
      saved = t.save_checkpoint();
    }
    if (world.rank == 0) {
      Layout one = one_rank(l);
      one.checkpoints = (dir / (name + "_to_1_resumed")).string();
      one.resume = saved;
      CpuOps ops;
      Trainer t(parity_config(one, dir), World{}, ops);
      REQUIRE(t.steps_done() == 5);
      check_parity(collect(t, kSteps - 5), reference);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  char path[512] = {};
  if (world.rank == 0) {
    Layout one = one_rank(l);
    one.checkpoints = (dir / ("1_to_" + name)).string();
    CpuOps ops;
    Trainer t(parity_config(one, dir), World{}, ops);
    for (int s = 0; s < 5; s++) t.step();
    std::snprintf(path, sizeof path, "%s", t.save_checkpoint().c_str());
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  Layout resumer = l;
  resumer.checkpoints = (dir / ("1_to_" + name + "_resumed")).string();
  resumer.resume = path;
  CpuOps ops;
  Trainer t(parity_config(resumer, dir), world, ops);
  REQUIRE(t.steps_done() == 5);
  const RunResult r = collect(t, kSteps - 5);
  check_parity(r, reference);
  check_tied_copies(r, resumer, world);
}

}  // namespace pt::test
