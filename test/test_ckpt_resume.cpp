// Resume: 20 steps straight and 10 + checkpoint + resume + 10 give bitwise-identical losses,
// gradient norms, learning rates, cursor and final state, also when the 10 steps were a finished
// run that is extended from its final checkpoint; checkpoint.resume's three forms;
// a model-shape mismatch names the key; a fresh run does not overwrite an existing run.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_dir.h"
#include "core/cpu/cpu_ops.h"
#include "core/report/run_report.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

TEST_CASE("resume is bit-exact: 20 steps straight equal 10 + checkpoint + resume + 10", "[ckpt]") {
  CkptFixture fx("ckpt_resume");
  // The same runs and checks on the CUDA backend: test/gpu_resume.cpp.
  const ResumeRuns runs = run_straight_and_resumed(fx, [] { return std::make_unique<CpuOps>(); }, 10, 20);
  check_bit_exact_resume(runs, fx);
}

TEST_CASE("a finished run extends from its final checkpoint bit-exactly: 10 + 10 more equal 20", "[ckpt]") {
  CkptFixture fx("ckpt_extend");
  // The schedule is constant after its warm-up, so a step's learning rate does not depend on
  // schedule.total_steps: the 10-step run's steps are the first 10 of the 20-step one. (Under
  // cosine or linear decay a longer schedule has other rates from the warm-up's end on, so the
  // extension continues a different run, by design; the other resume tests keep total_steps.)
  const std::vector<std::string> constant = {"schedule.decay=constant"};
  const World world;
  ResumeRuns r;
  r.at = 10;
  r.total = 20;
  {
    CpuOps ops;
    Trainer a(fx.config(with(constant, {"schedule.total_steps=20"}), "straight"), world, ops);
    for (int i = 0; i < r.total; i++) r.straight.push_back(a.step());
    r.straight_state = full_state(a, ops);
    r.straight_cursor = a.cursor();
  }
  {
    // A whole run of 10 steps, with no checkpoint settings: what it leaves is its final checkpoint.
    CpuOps ops;
    Trainer b(fx.config(with(constant, {"schedule.total_steps=10"})), world, ops);
    b.run();
    r.saved = b.final_checkpoint();
  }
  // Its steps as metrics.jsonl logged them (every step; JSON keeps a double's every bit).
  for (const nlohmann::json& m : read_metrics((fx.dir / "run" / "metrics.jsonl").string())) {
    StepResult s;
    s.loss = m.at("loss").get<double>();
    s.grad_norm = m.at("grad_norm").get<double>();
    s.lr = m.at("lr").get<double>();
    r.split.push_back(s);
  }
  REQUIRE(r.split.size() == 10u);
  CpuOps ops;
  Trainer c(fx.config(with(constant, {"schedule.total_steps=20", "checkpoint.resume=auto"})), world, ops);
  r.resumed_steps_done = c.steps_done();
  r.resumed_from = c.checkpointer().resumed_from();
  REQUIRE(r.resumed_steps_done == r.at);
  for (int i = r.at; i < r.total; i++) r.split.push_back(c.step());
  r.resumed_state = full_state(c, ops);
  r.resumed_cursor = c.cursor();
  check_bit_exact_resume(r, fx);
}

TEST_CASE("checkpoint.resume takes auto, a step directory or a checkpoint directory", "[ckpt]") {
  CkptFixture fx("ckpt_resume_forms");
  const World world;
  std::vector<float> at3, at5;
  {
    CpuOps ops;
    Trainer t(fx.config(), world, ops);
    for (int i = 0; i < 3; i++) t.step();
    t.save_checkpoint();
    at3 = full_state(t, ops);
    for (int i = 0; i < 2; i++) t.step();
    t.save_checkpoint();
    at5 = full_state(t, ops);
  }
  struct Case {
    std::string resume;
    int step;
    const std::vector<float>* state;
  };
  for (const Case& k : {Case{"auto", 5, &at5}, Case{fx.step_dir(3), 3, &at3}, Case{fx.ckpt_dir(), 5, &at5}}) {
    DYNAMIC_SECTION("resume=" << k.resume) {
      CpuOps ops;
      // From a path, new checkpoints may go elsewhere: resuming does not need its directory.
      std::vector<std::string> sets = {"checkpoint.resume=" + k.resume};
      if (k.resume != "auto") sets.push_back("checkpoint.dir=" + (fx.dir / "other").string());
      Trainer t(fx.config(sets), world, ops);
      CHECK(t.steps_done() == k.step);
      CHECK(same_bytes(full_state(t, ops), *k.state));
    }
  }
  SECTION("auto with no checkpoint starts fresh") {
    CpuOps ops;
    Trainer t(fx.config({"checkpoint.resume=auto", "checkpoint.dir=" + (fx.dir / "empty").string()}), world, ops);
    CHECK(t.steps_done() == 0);
    CHECK(t.checkpointer().resumed_from().empty());
  }
  SECTION("a path that is no checkpoint is a config error") {
    CpuOps ops;
    CHECK_THROWS_AS(Trainer(fx.config({"checkpoint.resume=" + fx.dir.string()}), world, ops), ConfigError);
    CHECK_THROWS_WITH(Trainer(fx.config({"checkpoint.resume=" + fx.dir.string()}), world, ops),
                      Contains("checkpoint.resume=" + fx.dir.string()) && Contains("neither a checkpoint"));
  }
}

TEST_CASE("a checkpoint of another model shape is refused, naming the key", "[ckpt]") {
  CkptFixture fx("ckpt_shape");
  const World world;
  {
    CpuOps ops;
    Trainer t(fx.config(), world, ops);
    t.step();
    t.save_checkpoint();
  }
  CpuOps ops;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.d_model=64", "model.d_model=64 but the checkpoint " + fx.step_dir(1) + " has 32"},
      {"model.n_layers=3", "model.n_layers=3 but the checkpoint"},
      {"model.n_heads=4", "model.n_heads=4 but the checkpoint"},
      {"model.max_seq_len=32", "model.max_seq_len=32 but the checkpoint"},
  };
  for (const auto& [set, want] : cases) {
    DYNAMIC_SECTION(set) {
      CHECK_THROWS_AS(Trainer(fx.config({"checkpoint.resume=auto", set}), world, ops), ConfigError);
      CHECK_THROWS_WITH(Trainer(fx.config({"checkpoint.resume=auto", set}), world, ops), Contains(want));
    }
  }
}

TEST_CASE("resume=none refuses a checkpoint directory that holds a run", "[ckpt]") {
  CkptFixture fx("ckpt_none");
  const World world;
  CpuOps ops;
  {
    Trainer t(fx.config(), world, ops);  // an empty directory is fine
    t.step();
    t.save_checkpoint();
  }
  CHECK_THROWS_AS(Trainer(fx.config(), world, ops), ConfigError);
  CHECK_THROWS_WITH(Trainer(fx.config(), world, ops),
                    Contains("checkpoint.resume=\"none\"") && Contains("step_00000001") &&
                        Contains("checkpoint.resume=auto"));
}

// Several ranks save and resume together: test/mpi_launch.cpp (reshard resume under mpirun).
