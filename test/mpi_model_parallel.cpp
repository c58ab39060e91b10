// Tensor parallel (with and without sequence parallel) and context parallel (ring attention and
// Ulysses) inside the trainer train exactly like one rank, alone and combined with data and
// pipeline parallel. Run under mpirun with 2, 4 and 8 ranks (test/CMakeLists.txt); every rank
// computes the one-rank reference itself, then trains under the layouts that fill the world:
//   2 ranks: tp2, tp2 + SP, cp2 ring, cp2 Ulysses;
//   4 ranks: tp4 (the last tp rank's vocabulary rows are all padding), cp4 ring, tp2 x cp2
//            (ring and Ulysses), dp2 x tp2 (+ SP, ZeRO-1 and ZeRO-3), dp2 x cp2; recompute
//            changes no bit under tp2 x cp2; checkpoints reshard tp2 x cp2 -> tp1 and back;
//   8 ranks: dp2 x tp2 x pp2 and tp2 x cp2 x pp2 (full 4-D with the pipeline).
// The loss and gradient norm of each of 10 steps, the validation loss and the final weights
// (whole parameters, gathered over tp) agree within 1e-5 relative (mpi_trainer_parity.h).
#include <mpi.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "core/plan/stage_memory.h"
#include "core/train/memory_plan.h"
#include "mpi_trainer_parity.h"

using namespace pt;
using namespace pt::test;

namespace {

const SharedShards& data() {
  static const SharedShards d("mpi_model_parallel", 9, 20000, 3000, kVocab);
  return d;
}

const RunResult& reference() {
  static const RunResult r = train(Layout{}, World{}, data().dir);
  return r;
}

void check(const Layout& l, const World& world) { check_trains_like(l, world, data().dir, reference()); }

}  // namespace

TEST_CASE("tensor and context parallel over two ranks train like one rank", "[mpi][tp][cp]") {
  const World world = whole_world();
  if (world.size != 2) return;
  for (const Layout& l : {grid(1, 2, 1), grid(1, 2, 1).with_sp(), grid(1, 1, 2), grid(1, 1, 2).with_ulysses()})
    check(l, world);
}

TEST_CASE("tp, cp and dp combined over four ranks train like one rank", "[mpi][tp][cp]") {
  const World world = whole_world();
  if (world.size != 4) return;
  for (const Layout& l :
       {grid(1, 4, 1), grid(1, 4, 1).with_sp(), grid(1, 1, 4), grid(1, 2, 2), grid(1, 2, 2).with_sp().with_ulysses(),
        grid(2, 2, 1), grid(2, 2, 1).with_sp().with_zero(1), grid(2, 2, 1).with_sp().with_zero(3), grid(2, 1, 2),
        grid(2, 1, 2).with_ulysses().with_zero(2)})
    check(l, world);
}

TEST_CASE("activation recompute changes no bit under tp2 x cp2", "[mpi][tp][cp][recompute]") {
  const World world = whole_world();
  if (world.size != 4) return;
  check_recompute_is_bitwise(grid(1, 2, 2).with_sp(), world, data().dir, 3);
}

TEST_CASE("checkpoints reshard: tp2 x cp2 -> tp1 and tp1 -> tp2 x cp2", "[mpi][tp][cp][ckpt]") {
  const World world = whole_world();
  if (world.size != 4) return;
  check_reshard_with_one_rank(grid(1, 2, 2).with_sp(), world, data().dir, "tp2sp_cp2", reference());
  check_reshard_with_one_rank(grid(1, 2, 2).with_ulysses(), world, data().dir, "tp2_cp2u", reference());
}

TEST_CASE("4-D layouts over eight ranks train like one rank", "[mpi][tp][cp][pipeline]") {
  const World world = whole_world();
  if (world.size != 8) return;
  check(grid(2, 2, 1, 2).with_sp().with_zero(1), world);
  check(grid(1, 2, 2, 2).with_schedule("interleaved", 2), world);
}

TEST_CASE("activation memory from the shapes equals what the stages allocate under tp, sp and cp",
          "[mpi][tp][cp][memory]") {
  const World world = whole_world();
  if (world.size > 4) return;  // 4 heads: tp <= 4
  const int n = world.size;
  std::vector<Layout> layouts = {grid(1, n, 1), grid(1, n, 1).with_sp(), grid(1, 1, n), grid(1, 1, n).with_ulysses()};
  if (n == 4) layouts.push_back(grid(1, 2, 2).with_sp());
  for (const Layout& l : layouts) {
    INFO(l.describe());
    check_activation_memory(l, world, data().dir);
  }
}
