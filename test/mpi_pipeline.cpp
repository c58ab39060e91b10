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
namespace fs = std::filesystem;

namespace {

const SharedShards& data() {
  static const SharedShards d("mpi_pipeline", 8, 20000, 3000, kVocab);
  return d;
}

RunResult train(const Layout& l, const World& world, int steps = kSteps) {
  return pt::test::train(l, world, data().dir, steps);
}

// The one-rank run, computed once by every rank on its own.
const RunResult& reference() {
  static const RunResult r = train(Layout{}, World{});
  return r;
}

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
  Layout l;
  l.pp = whole_world().size;
  l.schedule = "afab";  // every micro-batch in flight at once
  check_recompute_is_bitwise(l, whole_world(), data().dir, 4);
}

TEST_CASE("checkpoints reshard: pp = world -> pp1 and pp1 -> pp = world", "[mpi][pipeline][ckpt]") {
  Layout l;
  l.pp = whole_world().size;
  check_reshard_with_one_rank(l, whole_world(), data().dir, "pp", reference());
}
