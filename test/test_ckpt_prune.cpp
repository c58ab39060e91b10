// Retention: keep_latest newest committed checkpoints plus every keep_every milestone; older
// ones are deleted only after a newer one is committed; uncommitted directories are neither
// loaded nor counted. Also the periodic and end-of-run saves of Trainer::run(): a finished run
// always leaves its trained model (checkpoint.final), once, unless told not to.
#include <catch2/catch.hpp>

#include <cerrno>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_dir.h"
#include "core/ckpt/durable_io.h"
#include "core/cpu/cpu_ops.h"

using namespace pt;
using namespace pt::test;
using ckpt::steps_to_prune;

namespace {
std::vector<int> on_disk(const std::string& dir) {
  std::vector<int> steps;
  for (const auto& e : fs::directory_iterator(dir))
    if (auto s = ckpt::parse_step_dir_name(e.path().filename().string())) steps.push_back(*s);
  std::sort(steps.begin(), steps.end());
  return steps;
}
}  // namespace

TEST_CASE("retention keeps the newest keep_latest and every milestone", "[ckpt]") {
  const std::vector<int> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  CHECK(steps_to_prune(ten, 2, 0) == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(steps_to_prune(ten, 2, 4) == std::vector<int>{1, 2, 3, 5, 6, 7});
  CHECK(steps_to_prune(ten, 3, 5) == std::vector<int>{1, 2, 3, 4, 6, 7});
  CHECK(steps_to_prune(ten, 10, 0).empty());
  CHECK(steps_to_prune(ten, 20, 0).empty());
  CHECK(steps_to_prune({100, 200}, 2, 0).empty());
  CHECK(steps_to_prune({}, 2, 3).empty());
}

TEST_CASE("a run saves every_steps and at the end, and leaves exactly the promised set", "[ckpt]") {
  CkptFixture fx("ckpt_prune_run");
  const World world;
  CpuOps ops;
  Trainer t(fx.config({"schedule.total_steps=10", "checkpoint.every_steps=3", "checkpoint.keep_latest=2",
                       "checkpoint.keep_every=6"}),
            world, ops);
  t.run();
  // Saved 3, 6, 9 and 10 (the end); 3 pruned when 9 was committed; 6 is a milestone.
  CHECK(on_disk(fx.ckpt_dir()) == std::vector<int>{6, 9, 10});
  CHECK(read_text(fx.ckpt_dir() + "/latest") == "step_00000010\n");
  CHECK(ckpt::scan_checkpoint_dir(fx.ckpt_dir()).leftovers.empty());
}

TEST_CASE("a run without a checkpoint section leaves a resumable checkpoint of its last step", "[ckpt]") {
  CkptFixture fx("ckpt_final_save");
  const World world;
  std::vector<float> trained;
  {
    CpuOps ops;
    Trainer t(fx.config({"schedule.total_steps=5"}), world, ops);  // every_steps 0, final by default
    t.run();
    CHECK(on_disk(fx.ckpt_dir()) == std::vector<int>{5});
    CHECK(read_text(fx.ckpt_dir() + "/latest") == "step_00000005\n");
    CHECK(t.final_checkpoint() == fx.step_dir(5));
    trained = full_state(t, ops);
  }
  // The whole training state: a new process picks up at step 5 with the same weights and moments.
  CpuOps ops;
  Trainer resumed(fx.config({"schedule.total_steps=5", "checkpoint.resume=auto"}), world, ops);
  CHECK(resumed.steps_done() == 5);
  CHECK(same_bytes(full_state(resumed, ops), trained));
}

TEST_CASE("checkpoint.final=false: the end is saved only when every_steps makes it due", "[ckpt]") {
  CkptFixture fx("ckpt_final_off");
  const World world;
  CpuOps ops;
  SECTION("without every_steps, no checkpoint at all") {
    Trainer t(fx.config({"schedule.total_steps=5", "checkpoint.final=false"}), world, ops);
    t.run();
    CHECK_FALSE(fs::exists(fx.ckpt_dir()));
    CHECK(t.final_checkpoint().empty());
  }
  SECTION("with every_steps, the due steps only") {
    Trainer t(fx.config({"schedule.total_steps=10", "checkpoint.every_steps=4", "checkpoint.final=false"}), world, ops);
    t.run();
    CHECK(on_disk(fx.ckpt_dir()) == std::vector<int>{4, 8});
    CHECK(t.final_checkpoint().empty());  // step 10 is not on disk
  }
}

TEST_CASE("a last step that every_steps saved is not saved again at the end", "[ckpt]") {
  CkptFixture fx("ckpt_final_once");
  const World world;
  CpuOps ops;
  Trainer t(fx.config({"schedule.total_steps=10", "checkpoint.every_steps=5"}), world, ops);
  t.run();
  CHECK(on_disk(fx.ckpt_dir()) == std::vector<int>{5, 10});
  CHECK(t.final_checkpoint() == fx.step_dir(10));
  // Two writes in all (steps 5 and 10), as the run report counts them.
  const nlohmann::json report = nlohmann::json::parse(read_text((fx.dir / "run" / "report.json").string()));
  CHECK(report["checkpoint"]["writes"] == 2);
  CHECK(report["checkpoint"]["final_checkpoint"] == fx.step_dir(10));
}

TEST_CASE("old checkpoints are pruned only after a newer one is committed", "[ckpt]") {
  CkptFixture fx("ckpt_prune_order");
  const World world;
  CpuOps ops;
  Trainer t(fx.config({"checkpoint.keep_latest=2"}), world, ops);
  for (int i = 0; i < 3; i++) {
    t.step();
    t.save_checkpoint();
  }
  CHECK(on_disk(fx.ckpt_dir()) == std::vector<int>{2, 3});

  t.step();
  ckpt::set_fault_hook([](std::string_view s, const std::string&) { return s == "rename" ? ENOSPC : 0; });
  CHECK_THROWS_AS(t.save_checkpoint(), RuntimeError);
  ckpt::set_fault_hook(nullptr);
  CHECK(on_disk(fx.ckpt_dir()) == std::vector<int>{2, 3});  // the failed save pruned nothing

  t.save_checkpoint();
  CHECK(on_disk(fx.ckpt_dir()) == std::vector<int>{3, 4});
}

TEST_CASE("a step directory newer than latest is not committed: not loaded, not pruned", "[ckpt]") {
  CkptFixture fx("ckpt_uncommitted");
  const World world;
  {
    CpuOps ops;
    Trainer t(fx.config(), world, ops);
    t.step();
    t.save_checkpoint();
    t.step();
    t.save_checkpoint();
  }
  // As if a save of step 9 was killed between its rename and the pointer update.
  fs::copy(fx.step_dir(2), fx.step_dir(9));
  const ckpt::DirScan scan = ckpt::scan_checkpoint_dir(fx.ckpt_dir());
  CHECK(scan.committed == std::vector<int>{1, 2});
  CHECK(scan.uncommitted == std::vector<int>{9});

  CpuOps ops;
  Trainer r(fx.config({"checkpoint.resume=auto"}), world, ops);
  CHECK(r.steps_done() == 2);
  r.step();
  r.save_checkpoint();
  CHECK(on_disk(fx.ckpt_dir()) == std::vector<int>{2, 3, 9});

  SECTION("a damaged latest pointer hides nothing: every complete checkpoint is considered") {
    std::ofstream(fx.ckpt_dir() + "/latest") << "garbage\n";
    CpuOps ops2;
    Trainer g(fx.config({"checkpoint.resume=auto"}), world, ops2);
    // step_00000009 is complete but its manifest says step 2 (it is a copy): skipped as corrupt.
    CHECK(g.steps_done() == 3);
    REQUIRE(g.checkpointer().warnings().size() == 2);
    CHECK_THAT(g.checkpointer().warnings()[0], Catch::Matchers::Contains("garbage"));
    CHECK_THAT(g.checkpointer().warnings()[1], Catch::Matchers::Contains("step_00000009") &&
                                                   Catch::Matchers::Contains("says step 2"));
  }
}
