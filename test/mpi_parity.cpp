// Data parallel over MPI trains exactly like one rank: run under mpirun with 2 and with 4 ranks
// (test/CMakeLists.txt), every rank trains the same config and seed twice, once as a world of
// one (the reference, no communication) and once as one DP rank of the whole world, under
// ZeRO 0, 1, 2 and 3 and, with 4 ranks, HSDP 2 x 2. The loss and the gradient norm of each of
// 10 steps, the validation loss and the final weights must agree within 1e-5 relative: the
// only difference is the order in which fp32 partial sums of different ranks are added.
// Each DP rank must also have read its own micro-batches, and all of them together exactly the
// reference's.
#include <mpi.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
#include "core/data/shard.h"
#include "core/train/trainer.h"
#include "mpi_test_support.h"
#include "relative_error.h"

using namespace pt;
using namespace pt::test;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 10, kB = 2, kT = 16, kSequencesPerStep = 16;

const SharedShards& data() {
  static const SharedShards d("mpi_parity", 21, 30000, 5000, 256);
  return d;
}

RunConfig config(int world_size, int zero_stage, int dp_replicate) {
  const fs::path dir = data().dir;
  nlohmann::json j = {
      {"run", {{"name", "parity"}, {"out_dir", (dir / "run").string()}, {"seed", 5}}},
      {"model", {{"n_layers", 2}, {"d_model", 32}, {"n_heads", 2}, {"vocab_size", 256}, {"max_seq_len", 64}}},
      // Small buckets: ZeRO 0 and 1 reduce several buckets, each padded to the shard count.
      {"parallel", {{"zero_stage", zero_stage}, {"dp_replicate", dp_replicate}, {"grad_bucket_mb", 0.01}}},
      {"batch", {{"micro_batch_size", kB}, {"seq_len", kT}, {"global_batch_tokens", kSequencesPerStep * kT}}},
      {"optim", {{"lr", 3e-3}, {"grad_clip", 0.5}}},  // clipping is active on these steps
      {"schedule", {{"total_steps", kSteps}, {"warmup_steps", 2}}},
      // 3 validation batches: with 2 or 4 ranks some rank has none in the last round.
      {"data", {{"train", (dir / "p_train_*.bin").string()}, {"val", (dir / "p_val_*.bin").string()},
                {"val_tokens", 3 * kB * kT}}},
  };
  return config_from_json(j, {}, world_size);
}

struct RunResult {
  std::vector<StepResult> steps;
  std::vector<float> weights;  // fp32 master, table order
  double val_loss = 0;
  std::vector<int32_t> tokens;  // every micro-batch's inputs then targets, in reading order
};

RunResult train(const RunConfig& cfg, const World& world) {
  CpuOps ops;
  Trainer t(cfg, world, ops);
  RunResult r;
  t.set_batch_observer([&](int, const int32_t* in, const int32_t* tg, size_t n) {
    r.tokens.insert(r.tokens.end(), in, in + n);
    r.tokens.insert(r.tokens.end(), tg, tg + n);
  });
  for (int s = 0; s < kSteps; s++) r.steps.push_back(t.step());
  r.weights = t.gather_master();
  r.val_loss = t.evaluate();
  return r;
}

// The one-rank run, computed once by every rank on its own.
const RunResult& reference() {
  static const RunResult r = train(config(1, 0, 1), World{});
  return r;
}

void check_parity(const RunResult& got, const RunResult& want) {
  REQUIRE(got.steps.size() == want.steps.size());
  for (size_t s = 0; s < got.steps.size(); s++) {
    INFO("step " << s + 1);
    CHECK(got.steps[s].loss == Approx(want.steps[s].loss).epsilon(1e-5));
    CHECK(got.steps[s].grad_norm == Approx(want.steps[s].grad_norm).epsilon(1e-5));
    CHECK(got.steps[s].lr == want.steps[s].lr);
  }
  REQUIRE(got.weights.size() == want.weights.size());
  CHECK(relative_l2(got.weights, want.weights) < 1e-5);
  CHECK(got.val_loss == Approx(want.val_loss).epsilon(1e-5));
}

}  // namespace

TEST_CASE("data parallel under ZeRO 0-3 trains like one rank", "[mpi]") {
  const World world = whole_world();
  for (int stage = 0; stage <= 3; stage++) {
    INFO("dp " << world.size << ", ZeRO-" << stage);
    check_parity(train(config(world.size, stage, 1), world), reference());
  }
}

TEST_CASE("HSDP (2 replicas x 2 shards) trains like one rank", "[mpi]") {
  const World world = whole_world();
  if (world.size != 4) return;  // the 2-rank run has no 2 x 2 layout
  for (int stage = 1; stage <= 3; stage++) {
    INFO("dp 4 = 2 replicas x 2 shards, ZeRO-" << stage);
    check_parity(train(config(world.size, stage, 2), world), reference());
  }
}

TEST_CASE("each DP rank reads its own micro-batches, together exactly one rank's", "[mpi]") {
  const World world = whole_world();
  const RunResult mine = train(config(world.size, 1, 1), world);
  const std::vector<int32_t>& want = reference().tokens;
  // Micro-batch m of DP rank d is the reference's micro-batch m*dp + d of the same step.
  const size_t batch = 2 * kB * kT;  // inputs and targets
  const size_t ref_micro = kSequencesPerStep / kB, my_micro = ref_micro / world.size;
  REQUIRE(mine.tokens.size() == kSteps * my_micro * batch);
  REQUIRE(want.size() == kSteps * ref_micro * batch);
  std::vector<int32_t> all(mine.tokens.size() * world.size);
  MPI_Allgather(mine.tokens.data(), static_cast<int>(mine.tokens.size()), MPI_INT32_T, all.data(),
                static_cast<int>(mine.tokens.size()), MPI_INT32_T, MPI_COMM_WORLD);

  size_t matched = 0, mismatched = 0;
  for (int d = 0; d < world.size; d++)
    for (int s = 0; s < kSteps; s++)
      for (size_t m = 0; m < my_micro; m++) {
        const int32_t* got = all.data() + d * mine.tokens.size() + (s * my_micro + m) * batch;
        const int32_t* ref = want.data() + (s * ref_micro + m * world.size + d) * batch;
        (std::equal(got, got + batch, ref) ? matched : mismatched)++;
      }
  // Every reference micro-batch of every step was read by exactly one DP rank (m*dp + d covers
  // 0 .. ref_micro-1 once each) ...
  CHECK(mismatched == 0);
  CHECK(matched == kSteps * ref_micro);
  // ... and the ranks read different tokens.
  for (int d = 1; d < world.size; d++)
    CHECK_FALSE(std::equal(all.begin(), all.begin() + batch, all.begin() + d * mine.tokens.size()));
}
