// The run's guards on one rank (core/train/run_guard.h), with faults injected through the
// trainer's test-only hook (InjectedFaults, never a config key):
//   - a NaN gradient or an infinite loss skips the step: the weights, master weights and Adam
//     moments stay bit for bit, and a resume afterwards is bit-exact;
//   - run.max_skipped_steps in a row end the run naming the step and its data, and every
//     checkpoint on disk is finite; with the guard off the save refuses the poisoned state;
//   - pruning keeps the newest checkpoint whose steps were all finite;
//   - a loss spike rolls back to the newest checkpoint and skips the data, and resuming from a
//     checkpoint written after the rollback is bit-exact;
//   - the corruption check finds a flipped bit, names the rank and host, and finds nothing on
//     clean runs (GPT-2 and Llama, with and without recompute).
// The multi-rank versions (dp, ZeRO, tp, pp) are in mpi_run_guard.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_dir.h"
#include "core/ckpt/checkpoint_reader.h"
#include "core/cpu/cpu_ops.h"
#include "core/report/run_report.h"
#include "core/train/run_guard.h"
#include "spike_threshold.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

namespace {

// Every value of every tensor of the checkpoint in `dir` is finite.
bool checkpoint_finite(const std::string& dir) {
  ckpt::CheckpointReader r(dir);
  for (const auto& t : r.manifest().tensors) {
    std::vector<float> v(t.numel());
    r.read_all(t.name, t.numel(), v.data());
    for (float x : v)
      if (!std::isfinite(x)) return false;
  }
  return true;
}

std::vector<int> committed_steps(const std::string& dir) { return ckpt::scan_checkpoint_dir(dir).committed; }

}  // namespace

TEST_CASE("loss_zscore: none until the window is full or when it has no spread", "[guard]") {
  CHECK_FALSE(loss_zscore({1, 2}, 3, 10).has_value());
  CHECK_FALSE(loss_zscore({2, 2, 2}, 3, 10).has_value());
  // mean 2, sample standard deviation 1: a loss of 5 is 3 deviations above.
  const auto z = loss_zscore({1, 2, 3}, 3, 5);
  REQUIRE(z.has_value());
  CHECK(*z == Approx(3.0));
}

TEST_CASE("RunGuard: skips in a row end the run, a spike stays out of the window", "[guard]") {
  RunSection run;
  run.max_skipped_steps = 2;
  run.spike = 2;
  run.spike_window = 3;
  RunGuard g(run);
  CHECK_FALSE(g.record_skip());
  g.record_update();  // the run of skips is broken
  CHECK_FALSE(g.record_skip());
  CHECK(g.record_skip());
  CHECK(g.record().skipped_steps == 3);
  CHECK(g.record().skipped_since_save == 3);
  CHECK(g.updates(10) == 7);
  g.saved();
  CHECK(g.record().skipped_since_save == 0);
  for (double loss : {3.0, 3.1, 2.9}) {
    CHECK_FALSE(g.spike(loss).has_value());
    g.accept_loss(loss);
  }
  CHECK(g.spike(9.0).has_value());
  CHECK_FALSE(g.spike(3.05).has_value());
  g.accept_loss(3.05);  // the oldest loss leaves the window
  CHECK(g.record().recent_losses == std::vector<double>{3.1, 2.9, 3.05});
  ckpt::HealthRecord saved;
  saved.skipped_steps = 1;
  saved.skipped_since_save = 4;
  g.rolled_back(saved);
  CHECK(g.record().rollbacks == 1);
  CHECK(g.record().skipped_steps == 1);
  CHECK(g.record().skipped_since_save == 0);  // the stretch after the checkpoint starts clean
  // A resumed run's guard starts the same way.
  CHECK(RunGuard(run, saved).record().skipped_since_save == 0);
}

TEST_CASE("a NaN gradient or an infinite loss skips the step and changes nothing", "[guard]") {
  CkptFixture fx("guard_skip");
  const World world;
  CpuOps ops;
  Trainer t(fx.config(), world, ops);
  InjectedFaults f;
  f.nan_gradient = {3};
  f.inf_loss = {5};
  t.inject_faults(f);
  for (int step = 1; step <= 6; step++) {
    const std::vector<float> before = full_state(t, ops);
    const uint64_t cursor = t.cursor();
    const StepResult r = t.step();
    INFO("step " << step);
    CHECK(t.cursor() != cursor);  // the batch is consumed either way
    const bool faulty = step == 3 || step == 5;
    CHECK(r.skipped == faulty);
    CHECK(same_bytes(full_state(t, ops), before) == faulty);
    if (step == 3) CHECK((std::isfinite(r.loss) && std::isnan(r.grad_norm)));
    if (step == 5) CHECK(std::isinf(r.loss));
  }
  CHECK(t.health().skipped_steps == 2);
  CHECK(t.health().skipped_in_a_row == 0);
}

TEST_CASE("a resume after a skipped step is bit-exact (AdamW counts the updates)", "[guard]") {
  CkptFixture fx("guard_resume");
  // A NaN gradient at step 3 in every run; the checkpoint after step 5 carries the skip.
  const auto nan_at_3 = [](Trainer& t) {
    InjectedFaults f;
    f.nan_gradient = {3};
    t.inject_faults(f);
  };
  const ResumeRuns r = run_straight_and_resumed(fx, [] { return std::make_unique<CpuOps>(); }, 5, 8, {}, nan_at_3);
  REQUIRE(r.straight.size() == 8u);
  CHECK(r.straight[2].skipped);
  CHECK(ckpt::CheckpointReader(r.saved).manifest().health.skipped_steps == 1);
  // Losses, norms (the skipped step's NaN compared by its bits), cursor and states, bit for bit.
  check_bit_exact_resume(r, fx);
}

TEST_CASE("run.max_skipped_steps in a row end the run, naming the step and its data; checkpoints stay finite",
          "[guard]") {
  CkptFixture fx("guard_limit");
  const World world;
  CpuOps ops;
  Trainer t(fx.config({"run.max_skipped_steps=3", "checkpoint.every_steps=2"}), world, ops);
  InjectedFaults f;
  f.nan_gradient = {4, 5, 6};
  t.inject_faults(f);
  REQUIRE_THROWS_WITH(t.run(), Contains("3 steps in a row") && Contains("run.max_skipped_steps=3") &&
                                   Contains("step 6") && Contains("tokens 320..383 of data.train") &&
                                   Contains("The newest checkpoint is " + fx.step_dir(6)));
  CHECK(committed_steps(fx.ckpt_dir()) == std::vector<int>{2, 4, 6});
  for (int step : {2, 4, 6}) CHECK(checkpoint_finite(fx.step_dir(step)));
  // The checkpoint of step 6 records the skips of its stretch (steps 5 and 6).
  CHECK(ckpt::CheckpointReader(fx.step_dir(6)).manifest().health.skipped_since_save == 2);
  CHECK(ckpt::CheckpointReader(fx.step_dir(6)).manifest().health.skipped_steps == 3);
}

TEST_CASE("with the guard off a non-finite state is never saved; the checkpoints before it stay", "[guard]") {
  CkptFixture fx("guard_off");
  const World world;
  CpuOps ops;
  Trainer t(fx.config({"run.max_skipped_steps=0", "checkpoint.every_steps=2"}), world, ops);
  InjectedFaults f;
  f.nan_gradient = {3};
  t.inject_faults(f);
  REQUIRE_THROWS_WITH(t.run(), Contains("training state of step 4 holds a non-finite value") &&
                                   Contains("not saved"));
  CHECK(committed_steps(fx.ckpt_dir()) == std::vector<int>{2});
  CHECK(checkpoint_finite(fx.step_dir(2)));
}

TEST_CASE("pruning keeps the newest checkpoint whose steps were all finite", "[guard]") {
  CkptFixture fx("guard_prune");
  const World world;
  CpuOps ops;
  // keep_latest 2, a save every 2 steps: steps 2 and 4 are clean, 6 covers the skipped step 5,
  // 8 covers skipped 7: step 4 must outlive its turn.
  Trainer t(fx.config({"checkpoint.every_steps=2", "checkpoint.keep_latest=2", "schedule.total_steps=8"}), world,
            ops);
  InjectedFaults f;
  f.nan_gradient = {5, 7};
  t.inject_faults(f);
  t.run();
  CHECK(committed_steps(fx.ckpt_dir()) == std::vector<int>{4, 6, 8});
  // Once a clean checkpoint follows, the old one goes at the next prune as usual.
  CHECK(ckpt::steps_to_prune({4, 6, 8, 10}, 2, 0, 10) == std::vector<int>{4, 6});
}

TEST_CASE("a loss spike rolls back to the newest checkpoint, skips the data, and resumes bit-exactly", "[guard]") {
  CkptFixture fx("guard_spike");
  const World world;
  // Steps 1-7 fill a 4-loss window; the loss of step 8 is made 10x (a spike): back to the
  // checkpoint of step 6, and the data skips the batches of steps 7 and 8 and 2 more.
  const std::vector<std::string> sets = {kSpikeSetting,          "run.spike_window=4",   "run.spike_skip_steps=2",
                                         "checkpoint.every_steps=2", "checkpoint.keep_latest=10",
                                         "schedule.total_steps=12",  "logging.every_steps=1"};
  InjectedFaults f;
  f.loss_scale = {{8, 10.0}};
  std::vector<float> straight_state;
  uint64_t straight_cursor = 0;
  {
    CpuOps ops;
    Trainer a(fx.config(sets), world, ops);
    a.inject_faults(f);
    a.run();
    CHECK(a.steps_done() == 12);
    CHECK(a.health().rollbacks == 1);
    straight_state = full_state(a, ops);
    straight_cursor = a.cursor();
  }
  // 12 steps trained from 16 batches' worth of data: 7 and 8 (before the rollback) and 2 more skipped.
  CHECK(straight_cursor == 16u * 64u);
  const nlohmann::json report = nlohmann::json::parse(read_text((fx.dir / "run" / "report.json").string()));
  CHECK(report["reliability"]["rollbacks"] == 1);
  REQUIRE(report["reliability"]["guard_events"].size() == 1u);
  CHECK_THAT(report["reliability"]["guard_events"][0].get<std::string>(),
             Contains("spike at step 8") && Contains("rolled back to the checkpoint of step 6") &&
                 Contains("skipping 256 tokens"));
  // metrics.jsonl: one record per step, steps 7 and 8 those of the second pass.
  const auto metrics = read_metrics((fx.dir / "run" / "metrics.jsonl").string());
  REQUIRE(metrics.size() == 12u);
  for (size_t i = 0; i < metrics.size(); i++) CHECK(metrics[i]["step"] == static_cast<int>(i) + 1);
  // A run resumed from the checkpoint of step 10 (written after the rollback) ends the same.
  CpuOps ops;
  Trainer b(fx.config(with(sets, {"checkpoint.resume=" + fx.step_dir(10)}), "resumed"), world, ops);
  CHECK(b.health().rollbacks == 1);
  for (int i = 0; i < 2; i++) b.step();
  CHECK(b.cursor() == straight_cursor);
  CHECK(same_bytes(full_state(b, ops), straight_state));
}

TEST_CASE("a spike before any checkpoint is logged and training goes on", "[guard]") {
  CkptFixture fx("guard_spike_early");
  const World world;
  CpuOps ops;
  Trainer t(fx.config({kSpikeSetting, "run.spike_window=3", "schedule.total_steps=6"}), world, ops);
  InjectedFaults f;
  f.loss_scale = {{5, 10.0}};
  t.inject_faults(f);
  t.run();
  CHECK(t.steps_done() == 6);
  CHECK(t.health().rollbacks == 0);
  const nlohmann::json report = nlohmann::json::parse(read_text((fx.dir / "run" / "report.json").string()));
  CHECK_THAT(report["reliability"]["guard_events"][0].get<std::string>(), Contains("no checkpoint yet"));
}

TEST_CASE("the corruption check finds a flipped bit and names the rank and host; clean runs pass it", "[guard]") {
  CkptFixture fx("guard_replay");
  const World world;
  SECTION("clean: GPT-2 and Llama, with and without recompute") {
    for (const std::vector<std::string>& model :
         {std::vector<std::string>{}, std::vector<std::string>{"recompute.mode=full"},
          std::vector<std::string>{"model.arch=llama", "model.n_kv_heads=1"},
          std::vector<std::string>{"model.arch=llama", "model.n_kv_heads=1", "recompute.mode=selective"}}) {
      CpuOps ops;
      Trainer t(fx.config(with(model, {"run.replay_every_steps=2"})), world, ops);
      for (int i = 0; i < 4; i++) {
        const StepResult r = t.step();
        CHECK(r.replayed == (i % 2 == 1));
        CHECK(r.replay_mismatches.empty());
      }
    }
  }
  SECTION("a flipped bit ends the run before the update") {
    CpuOps ops;
    Trainer t(fx.config({"run.replay_every_steps=2"}), world, ops);
    InjectedFaults f;
    f.flip_replay_bit = {4};
    t.inject_faults(f);
    t.step();
    t.step();
    t.step();
    const std::vector<float> before = full_state(t, ops);
    REQUIRE_THROWS_WITH(t.step(), Contains("corruption check: step 4") && Contains("rank 0 (host ") &&
                                      Contains("the step was not applied"));
    CHECK(same_bytes(full_state(t, ops), before));
  }
  SECTION("run.replay_mismatch=warn counts it and trains on") {
    CpuOps ops;
    Trainer t(fx.config({"run.replay_every_steps=2", "run.replay_mismatch=warn", "schedule.total_steps=4"}), world,
              ops);
    InjectedFaults f;
    f.flip_replay_bit = {2};
    t.inject_faults(f);
    t.run();
    const nlohmann::json report = nlohmann::json::parse(read_text((fx.dir / "run" / "report.json").string()));
    CHECK(report["reliability"]["replay_checks"] == 2);
    CHECK(report["reliability"]["replay_mismatches"] == 1);
  }
}
