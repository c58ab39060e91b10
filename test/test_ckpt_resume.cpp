// Resume: 20 steps straight and 10 + checkpoint + resume + 10 give bitwise-identical losses,
// gradient norms, learning rates, cursor and final state; checkpoint.resume's three forms;
// a model-shape mismatch names the key; a fresh run does not overwrite an existing run.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_dir.h"
#include "core/cpu/cpu_ops.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

TEST_CASE("resume is bit-exact: 20 steps straight equal 10 + checkpoint + resume + 10", "[ckpt]") {
  CkptFixture fx("ckpt_resume");
  // The same runs and checks on the CUDA backend: test/gpu_resume.cpp.
  const ResumeRuns runs = run_straight_and_resumed(fx, [] { return std::make_unique<CpuOps>(); }, 10, 20);
  check_bit_exact_resume(runs, fx);
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
