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

#include <catch2/catch.hpp>
#include <filesystem>

#include "mpi_trainer_parity.h"

using namespace pt;
using namespace pt::test;

namespace {

const SharedShards& data() {
  static const SharedShards d("mpi_pipeline", 8, 20000, 3000, kVocab);
  return d;
}

// The one-rank run, computed once by every rank on its own.
const RunResult& reference() {
  static const RunResult r = train(Layout{}, World{}, data().dir);
  return r;
}

}  // namespace

TEST_CASE("pipeline parallel trains like one rank under afab, 1f1b and interleaved", "[mpi][pipeline]") {
  const World world = whole_world();
  for (const auto& [schedule, v] : {std::pair{"afab", 1}, std::pair{"1f1b", 1}, std::pair{"interleaved", 2}}) {
    check_trains_like(grid(1, 1, 1, world.size).with_schedule(schedule, v), world, data().dir, reference());
  }
}

TEST_CASE("an uneven parallel.pp_layers split trains like one rank", "[mpi][pipeline]") {
  const World world = whole_world();
  Layout l = grid(1, 1, 1, world.size);
  l.pp_layers = world.size == 2 ? std::vector<int>{3, 5} : std::vector<int>{1, 3, 3, 1};
  check_trains_like(l, world, data().dir, reference());
}

TEST_CASE("dp2 x pp2 trains like one rank under ZeRO 0-3", "[mpi][pipeline]") {
  const World world = whole_world();
  if (world.size != 4) return;
  for (int zero : {0, 1, 2, 3}) check_trains_like(grid(2, 1, 1, 2).with_zero(zero), world, data().dir, reference());
}

TEST_CASE("activation recompute changes no bit of a pipeline run", "[mpi][pipeline][recompute]") {
  // AFAB: every micro-batch in flight at once.
  check_recompute_is_bitwise(grid(1, 1, 1, whole_world().size).with_schedule("afab"), whole_world(), data().dir, 4);
}

TEST_CASE("checkpoints reshard: pp = world -> pp1 and pp1 -> pp = world", "[mpi][pipeline][ckpt]") {
  check_reshard_with_one_rank(grid(1, 1, 1, whole_world().size), whole_world(), data().dir, "pp", reference());
}
