// Pipeline parallel over MPI trains exactly like one rank. Run under mpirun with 2 and with 4
// ranks (test/CMakeLists.txt): every rank computes the one-rank reference itself (a world of
// one), then trains as one stage of a pipeline over the whole world: pp = world size under
// afab, 1f1b and interleaved (2 virtual stages), an uneven parallel.pp_layers split, and, with
// 4 ranks, dp2 x pp2 under ZeRO 0-3. The loss and gradient norm of each of 10 steps,
// the validation loss and the final weights (each rank its stage's, by name) must agree within
// 1e-5 relative, and the two copies of the tied wte (first and last stage) must be equal.
// Activation recompute changes no bit of the pipeline's run. Checkpoints reshard: a pp run
// saved at step 5 resumes under pp1 (rank 0 alone), and a pp1 run resumes under pp = world,
// on the reference trajectory.
#include <mpi.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
#include "core/data/shard.h"
#include "core/train/trainer.h"
#include "mpi_test_support.h"

using namespace pt;
using namespace pt::test;
namespace fs = std::filesystem;

namespace {

// 8 blocks (pp4 x 2 virtual stages), 16 sequences of 8 tokens per step: 8 micro-batches of 2
// per pipeline (4 with dp 2), a multiple of pp as interleaving needs.
constexpr int kSteps = 10, kB = 2, kT = 8, kSequencesPerStep = 16, kVocab = 96;

const SharedShards& data() {
  static const SharedShards d("mpi_pipeline", 8, 20000, 3000, kVocab);
  return d;
}

struct Layout {
  int pp = 1, dp = 1, v = 1, zero = 0;
  std::string schedule = "1f1b";
  std::vector<int> pp_layers;
  std::string recompute = "none";
  std::string checkpoints;  // checkpoint.dir ("" : unused)
  std::string resume = "none";
};

RunConfig config(const Layout& l) {
  const fs::path dir = data().dir;
  nlohmann::json j = {
      {"run", {{"name", "pipeline"}, {"out_dir", (dir / "run").string()}, {"seed", 11}}},
      {"model", {{"n_layers", 8}, {"d_model", 16}, {"n_heads", 2}, {"vocab_size", kVocab}, {"pad_vocab_multiple", 64},
                 {"max_seq_len", 16}}},
      {"parallel", {{"pp", l.pp}, {"dp", l.dp}, {"pp_schedule", l.schedule}, {"pp_virtual_stages", l.v},
                    {"pp_layers", l.pp_layers}, {"zero_stage", l.zero}, {"grad_bucket_mb", 0.002}}},
      {"recompute", {{"mode", l.recompute}}},
      {"batch", {{"micro_batch_size", kB}, {"seq_len", kT}, {"global_batch_tokens", kSequencesPerStep * kT}}},
      {"optim", {{"lr", 1e-2}, {"grad_clip", 0.5}}},  // clipping is active on these steps
      {"schedule", {{"total_steps", kSteps}, {"warmup_steps", 2}}},
      {"data", {{"train", (dir / "p_train_*.bin").string()}, {"val", (dir / "p_val_*.bin").string()},
                {"val_tokens", 3 * kB * kT}}},
      {"checkpoint", {{"dir", l.checkpoints.empty() ? (dir / "unused").string() : l.checkpoints},
                      {"resume", l.resume}}},
  };
  return config_from_json(j, {}, l.pp * l.dp);
}

struct RunResult {
  std::vector<StepResult> steps;
  std::map<std::string, std::vector<float>> weights;  // this rank's stage's fp32 master weights
  double val_loss = 0;
  int first_step = 0;  // > 0 when resumed
};

RunResult collect(Trainer& t, int steps, bool evaluate = true) {
  RunResult r;
  r.first_step = t.steps_done();
  for (int s = 0; s < steps; s++) r.steps.push_back(t.step());
  const std::vector<float> w = t.gather_master();
  for (const auto& p : t.stage_table().specs())
    r.weights[p.name].assign(w.begin() + p.offset, w.begin() + p.offset + p.numel);
  if (evaluate) r.val_loss = t.evaluate();
  return r;
}

RunResult train(const Layout& l, const World& world, int steps = kSteps) {
  CpuOps ops;
  Trainer t(config(l), world, ops);
  return collect(t, steps);
}

// The one-rank run, computed once by every rank on its own.
const RunResult& reference() {
  static const RunResult r = train(Layout{}, World{});
  return r;
}

// Losses and norms of the steps `got` ran; once it has reached the reference's last step, also
// the final weights and (when it evaluated) the validation loss.
void check_parity(const RunResult& got, const RunResult& want, bool check_val = true) {
  for (size_t s = 0; s < got.steps.size(); s++) {
    const size_t ref = got.first_step + s;
    INFO("step " << ref + 1);
    REQUIRE(ref < want.steps.size());
    CHECK(got.steps[s].loss == Approx(want.steps[ref].loss).epsilon(1e-5));
    CHECK(got.steps[s].grad_norm == Approx(want.steps[ref].grad_norm).epsilon(1e-5));
    CHECK(got.steps[s].lr == want.steps[ref].lr);
  }
  if (got.first_step + got.steps.size() != want.steps.size()) return;
  double num = 0, den = 0;
  for (const auto& [name, w] : got.weights) {
    const std::vector<float>& ref = want.weights.at(name);
    REQUIRE(ref.size() == w.size());
    for (size_t i = 0; i < w.size(); i++) {
      num += (double(w[i]) - ref[i]) * (double(w[i]) - ref[i]);
      den += double(ref[i]) * ref[i];
    }
  }
  CHECK(!got.weights.empty());
  CHECK(std::sqrt(num / den) < 1e-5);
  if (check_val) CHECK(got.val_loss == Approx(want.val_loss).epsilon(1e-5));
}

// The tied embedding's two copies, on the first and the last stage of each pipeline, are equal
// bit for bit (their gradients are summed between the two ranks every step).
void check_tied_copies(const RunResult& r, const Layout& l, const World& world) {
  const int pp_coord = world.rank / l.dp;  // order tp-cp-dp-pp: pp varies slowest
  const bool first = pp_coord == 0, last = pp_coord == l.pp - 1;
  const int peer = first ? world.rank + (l.pp - 1) * l.dp : world.rank - (l.pp - 1) * l.dp;
  if (!first && !last) return;
  std::vector<float> mine = r.weights.at("wte"), theirs(mine.size());
  MPI_Sendrecv(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, peer, 7, theirs.data(),
               static_cast<int>(theirs.size()), MPI_FLOAT, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  CHECK(mine == theirs);
}

// A checkpoint directory in the shared scratch directory (each name used once per run).
std::string shared_dir(const std::string& name) { return (data().dir / name).string(); }

}  // namespace

TEST_CASE("pipeline parallel trains like one rank under afab, 1f1b and interleaved", "[mpi][pipeline]") {
  const World world = whole_world();
  for (const auto& [schedule, v] : {std::pair{"afab", 1}, std::pair{"1f1b", 1}, std::pair{"interleaved", 2}}) {
    Layout l;
    l.pp = world.size;
    l.schedule = schedule;
    l.v = v;
    INFO("pp " << l.pp << ", " << schedule << ", v " << v);
    const RunResult r = train(l, world);
    check_parity(r, reference());
    check_tied_copies(r, l, world);
  }
}

TEST_CASE("an uneven parallel.pp_layers split trains like one rank", "[mpi][pipeline]") {
  const World world = whole_world();
  Layout l;
  l.pp = world.size;
  l.pp_layers = world.size == 2 ? std::vector<int>{3, 5} : std::vector<int>{1, 3, 3, 1};
  check_parity(train(l, world), reference());
}

TEST_CASE("dp2 x pp2 trains like one rank under ZeRO 0-3", "[mpi][pipeline]") {
  const World world = whole_world();
  if (world.size != 4) return;
  for (int zero : {0, 1, 2, 3}) {
    Layout l;
    l.pp = 2;
    l.dp = 2;
    l.zero = zero;
    INFO("dp 2 x pp 2, ZeRO-" << zero);
    const RunResult r = train(l, world);
    check_parity(r, reference());
    check_tied_copies(r, l, world);
  }
}

TEST_CASE("activation recompute changes no bit of a pipeline run", "[mpi][pipeline][recompute]") {
  const World world = whole_world();
  Layout l;
  l.pp = world.size;
  l.schedule = "afab";  // every micro-batch in flight at once
  const RunResult none = train(l, world, 4);
  for (const char* mode : {"selective", "full"}) {
    INFO("recompute " << mode);
    l.recompute = mode;
    const RunResult r = train(l, world, 4);
    for (size_t s = 0; s < r.steps.size(); s++) {
      CHECK(r.steps[s].loss == none.steps[s].loss);
      CHECK(r.steps[s].grad_norm == none.steps[s].grad_norm);
    }
    CHECK(r.weights == none.weights);
  }
}

TEST_CASE("checkpoints reshard: pp = world -> pp1 and pp1 -> pp = world", "[mpi][pipeline][ckpt]") {
  const World world = whole_world();
  SECTION("saved by the pipeline, resumed on one rank") {
    Layout l;
    l.pp = world.size;
    l.checkpoints = shared_dir("pp_to_1");
    std::string saved;
    {
      CpuOps ops;
      Trainer t(config(l), world, ops);
      check_parity(collect(t, 5, false), reference(), false);
      saved = t.save_checkpoint();
    }
    if (world.rank == 0) {
      Layout one;
      one.checkpoints = shared_dir("pp_to_1_resumed");
      one.resume = saved;
      CpuOps ops;
      Trainer t(config(one), World{}, ops);
      REQUIRE(t.steps_done() == 5);
      check_parity(collect(t, kSteps - 5), reference());
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  SECTION("saved by one rank, resumed by the pipeline") {
    char path[512] = {};
    if (world.rank == 0) {
      Layout one;
      one.checkpoints = shared_dir("1_to_pp");
      CpuOps ops;
      Trainer t(config(one), World{}, ops);
      for (int s = 0; s < 5; s++) t.step();
      std::snprintf(path, sizeof path, "%s", t.save_checkpoint().c_str());
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    Layout l;
    l.pp = world.size;
    l.checkpoints = shared_dir("1_to_pp_resumed");
    l.resume = path;
    CpuOps ops;
    Trainer t(config(l), world, ops);
    REQUIRE(t.steps_done() == 5);
    const RunResult r = collect(t, kSteps - 5);
    check_parity(r, reference());
    check_tied_copies(r, l, world);
  }
}
