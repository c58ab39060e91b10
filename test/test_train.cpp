// The training loop: LR schedule boundaries, and gradient accumulation equal to one larger batch.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
#include "core/data/shard.h"
#include "core/train/lr_schedule.h"
#include "core/train/trainer.h"
#include "relative_error.h"

using namespace pt;
using pt::test::relative_l2;
namespace fs = std::filesystem;

TEST_CASE("LR schedule at its boundary steps", "[schedule]") {
  OptimSection o;
  o.lr = 1.0;
  ScheduleSection s;
  s.total_steps = 100;
  s.warmup_steps = 10;
  s.min_lr_ratio = 0.1;

  SECTION("warmup is linear from lr/W to lr") {
    s.decay = "cosine";
    CHECK(lr_at(o, s, 0) == Approx(0.1));
    CHECK(lr_at(o, s, 4) == Approx(0.5));
    CHECK(lr_at(o, s, 9) == Approx(1.0));
  }
  SECTION("cosine: full lr after warmup, half-way point, min at the last step") {
    s.decay = "cosine";
    CHECK(lr_at(o, s, 10) == Approx(1.0));
    // p = (s - 10) / 89; half-way is not an integer step, so check the formula at step 55.
    const double p = 45.0 / 89.0;
    CHECK(lr_at(o, s, 55) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * p))));
    CHECK(lr_at(o, s, 99) == Approx(0.1));
  }
  SECTION("linear") {
    s.decay = "linear";
    CHECK(lr_at(o, s, 10) == Approx(1.0));
    CHECK(lr_at(o, s, 99) == Approx(0.1));
    CHECK(lr_at(o, s, 54) == Approx(1.0 - 0.9 * 44.0 / 89.0));
  }
  SECTION("wsd: stable until the cooldown, then linear to the minimum") {
    s.decay = "wsd";
    s.cooldown_fraction = 0.2;  // cooldown begins at step 80
    CHECK(lr_at(o, s, 10) == Approx(1.0));
    CHECK(lr_at(o, s, 79) == Approx(1.0));
    CHECK(lr_at(o, s, 80) == Approx(1.0));
    CHECK(lr_at(o, s, 99) == Approx(0.1));
    CHECK(lr_at(o, s, 90) < 1.0);
  }
  SECTION("constant") {
    s.decay = "constant";
    CHECK(lr_at(o, s, 10) == Approx(1.0));
    CHECK(lr_at(o, s, 99) == Approx(1.0));
  }
  SECTION("no warmup starts at full lr") {
    s.warmup_steps = 0;
    s.decay = "cosine";
    CHECK(lr_at(o, s, 0) == Approx(1.0));
  }
}

namespace {
// A temporary run directory with one train shard of random byte tokens.
struct TempRun {
  fs::path dir;
  TempRun() {
    dir = fs::temp_directory_path() / ("picotrain_test_train_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::mt19937 rng(5);
    std::vector<uint16_t> tokens(20000);
    for (auto& t : tokens) t = rng() % 256;
    write_shard((dir / "d_train_000000.bin").string(), tokens);
  }
  ~TempRun() { fs::remove_all(dir); }

  RunConfig config(int micro_batch, int global_tokens) const {
    nlohmann::json j = {
        {"run", {{"name", "t"}, {"out_dir", (dir / "run").string()}, {"seed", 9}}},
        {"model", {{"n_layers", 2}, {"d_model", 32}, {"n_heads", 2}, {"vocab_size", 256}, {"max_seq_len", 64}}},
        {"batch", {{"micro_batch_size", micro_batch}, {"seq_len", 16}, {"global_batch_tokens", global_tokens}}},
        {"optim", {{"lr", 1e-3}}},
        {"schedule", {{"total_steps", 3}, {"warmup_steps", 0}}},
        {"data", {{"train", (dir / "d_train_*.bin").string()}}},
    };
    return config_from_json(j, {}, 1);
  }
};

}  // namespace

TEST_CASE("gradient accumulation over k micro-batches equals one batch k times larger", "[train]") {
  TempRun tmp;
  CpuOps ops_a, ops_b;
  const RunConfig accum4 = tmp.config(2, 2 * 16 * 4);  // 4 micro-batches of 2 sequences
  const RunConfig whole = tmp.config(8, 8 * 16);       // 1 micro-batch of 8 sequences
  REQUIRE(accum4.batch.grad_accum_steps == 4);
  REQUIRE(whole.batch.grad_accum_steps == 1);
  World world;
  Trainer a(accum4, world, ops_a), b(whole, world, ops_b);
  for (int step = 0; step < 3; step++) {
    const StepResult ra = a.step(), rb = b.step();
    INFO("step " << step);
    // fp32 sums taken in a different grouping: agreement to ~1e-6 relative.
    CHECK(ra.loss == Approx(rb.loss).epsilon(1e-5));
    CHECK(ra.grad_norm == Approx(rb.grad_norm).epsilon(1e-4));
  }
  CHECK(a.cursor() == b.cursor());
  const size_t n = a.params().table().total_numel();
  std::vector<float> wa(n), wb(n), ga(n), gb(n);
  a.params().save_master(wa.data());
  b.params().save_master(wb.data());
  ops_a.download(ga.data(), DType::f32, a.params().all_grads(), n);
  ops_b.download(gb.data(), DType::f32, b.params().all_grads(), n);
  CHECK(relative_l2(gb, ga) < 1e-5);
  CHECK(relative_l2(wb, wa) < 1e-5);
}
