// The run's guards over several ranks (mpirun -np 2 and 4; one rank: test_run_guard.cpp), under
// dp (ZeRO 0 and 1), tp with sequence parallel, pp, cp (ring), expert parallel and products, with faults injected on
// ONE rank through the trainer's test-only hook:
//   - a NaN in one rank's gradient and an infinite loss on another: every rank skips the same
//     step, no rank's weights change, and a resume after it is bit-exact;
//   - a loss spike: every rank rolls back to the same checkpoint (rank 0's verdict), and a run
//     resumed from a checkpoint written after the rollback ends with the same weights;
//   - a flipped bit in one rank's corruption-check replay: every rank ends the step with an error
//     naming that rank, before the update; clean runs under every layout pass the check.
#include <mpi.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cstring>

#include "mpi_trainer_parity.h"
#include "spike_threshold.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

namespace {

const SharedShards& data() {
  static const SharedShards d("mpi_run_guard", 9, 20000, 3000, kVocab);
  return d;
}

// The layouts of `ranks` ranks the guards are checked under.
std::vector<Layout> layouts(int ranks) {
  if (ranks == 2) {
    Layout moe = grid(2, 1, 1).with_ep(2);  // a Llama with 4 experts, 2 on each rank
    moe.arch = "llama";
    moe.experts = 4;
    return {grid(2, 1, 1), grid(2, 1, 1).with_zero(1), grid(1, 2, 1).with_sp(), grid(1, 1, 1, 2), grid(1, 1, 2), moe};
  }
  if (ranks == 4) return {grid(2, 1, 1, 2), grid(2, 2, 1).with_sp().with_zero(1)};
  return {};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The faults: a NaN gradient on the last rank at step 3, an infinite loss on rank 0 at step 5.
InjectedFaults faults_of(const World& world) {
  InjectedFaults f;
  if (world.rank == world.size - 1) f.nan_gradient = {3};
  if (world.rank == 0) f.inf_loss = {5};
  return f;
}

std::filesystem::path checkpoint_dir(const std::string& name) {
  return data().dir / ("ckpt_" + name);
}

}  // namespace

TEST_CASE("a non-finite step on one rank is skipped on every rank, and a resume after it is bit-exact",
          "[mpi][guard]") {
  const World world = whole_world();
  for (const Layout& base : layouts(world.size)) {
    INFO(base.describe());
    // Straight: 6 steps, the weights compared around each step.
    std::vector<float> straight;
    {
      CpuOps ops;
      Trainer t(parity_config(base, data().dir), world, ops);
      t.inject_faults(faults_of(world));
      for (int step = 1; step <= 6; step++) {
        const std::vector<float> before = t.gather_master();
        const StepResult r = t.step();
        const bool faulty = step == 3 || step == 5;
        INFO("step " << step);
        CHECK(r.skipped == faulty);
        CHECK(same_bits(t.gather_master(), before) == faulty);
      }
      CHECK(t.health().skipped_steps == 2);
      straight = t.gather_master();
    }
    // Split: 4 steps, a checkpoint, a new trainer resumed from it, 2 more.
    Layout saving = base;
    saving.checkpoints = (checkpoint_dir("resume") / std::to_string(world.size)).string();
    {
      CpuOps ops;
      Trainer t(parity_config(saving, data().dir), world, ops);
      t.inject_faults(faults_of(world));
      for (int step = 0; step < 4; step++) t.step();
      t.save_checkpoint();
    }
    Layout resuming = saving;
    resuming.resume = "auto";
    CpuOps ops;
    Trainer t(parity_config(resuming, data().dir), world, ops);
    REQUIRE(t.steps_done() == 4);
    t.inject_faults(faults_of(world));
    for (int step = 0; step < 2; step++) t.step();
    CHECK(same_bits(t.gather_master(), straight));
    MPI_Barrier(MPI_COMM_WORLD);
    if (world.rank == 0) std::filesystem::remove_all(saving.checkpoints);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("the corruption check: clean under every layout; one rank's flipped bit stops every rank, naming it",
          "[mpi][guard]") {
  const World world = whole_world();
  for (const Layout& base : layouts(world.size)) {
    INFO(base.describe());
    RunConfig cfg = parity_config(base, data().dir);
    cfg.run.replay_every_steps = 2;
    {
      CpuOps ops;
      Trainer t(cfg, world, ops);
      for (int step = 1; step <= 4; step++) {
        const StepResult r = t.step();
        CHECK(r.replayed == (step % 2 == 0));
        CHECK(r.replay_mismatches.empty());
      }
    }
    CpuOps ops;
    Trainer t(cfg, world, ops);
    InjectedFaults f;
    const int faulty = world.size - 1;
    if (world.rank == faulty) f.flip_replay_bit = {2};
    t.inject_faults(f);
    t.step();
    const std::vector<float> before = t.gather_master();
    CHECK_THROWS_WITH(t.step(), Contains("rank " + std::to_string(faulty) + " (host ") &&
                                    !Contains("rank 0 (host") && Contains("the step was not applied"));
    CHECK(same_bits(t.gather_master(), before));
  }
}

TEST_CASE("a loss spike rolls every rank back to the same checkpoint, and a resume after it is bit-exact",
          "[mpi][guard]") {
  const World world = whole_world();
  for (const Layout& base : layouts(world.size)) {
    INFO(base.describe());
    Layout l = base;
    l.checkpoints = (checkpoint_dir("spike") / std::to_string(world.size)).string();
    RunConfig cfg = parity_config(l, data().dir);
    cfg.run.spike = kSpikeSigmas;
    cfg.run.spike_window = 4;
    cfg.run.spike_skip_steps = 2;
    cfg.checkpoint.every_steps = 2;
    cfg.checkpoint.keep_latest = 10;
    std::vector<float> straight;
    uint64_t cursor = 0;
    {
      CpuOps ops;
      Trainer t(cfg, world, ops);
      // The spike is in every rank's loss, as a real one would be (the head's ranks' matters).
      InjectedFaults f;
      f.loss_scale = {{8, 10.0}};
      t.inject_faults(f);
      t.run();
      CHECK(t.steps_done() == kSteps);
      CHECK(t.health().rollbacks == 1);
      straight = t.gather_master();
      cursor = t.cursor();
    }
    // 10 steps trained on 14 batches' worth of data: 7 and 8 before the rollback, 2 more skipped.
    CHECK(cursor == 14u * kSequencesPerStep * kT);
    RunConfig resumed = cfg;
    resumed.checkpoint.resume = l.checkpoints + "/step_00000008";
    CpuOps ops;
    Trainer t(resumed, world, ops);
    REQUIRE(t.steps_done() == 8);
    CHECK(t.health().rollbacks == 1);
    for (int step = 8; step < kSteps; step++) t.step();
    CHECK(same_bits(t.gather_master(), straight));
    CHECK(t.cursor() == cursor);
    MPI_Barrier(MPI_COMM_WORLD);
    if (world.rank == 0) std::filesystem::remove_all(l.checkpoints);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
