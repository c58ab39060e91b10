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
#include <cstdio>
#include <filesystem>

#include "core/plan/stage_memory.h"
#include "core/train/memory_plan.h"
#include "mpi_trainer_parity.h"

using namespace pt;
using namespace pt::test;
namespace fs = std::filesystem;

namespace {

const SharedShards& data() {
  static const SharedShards d("mpi_model_parallel", 9, 20000, 3000, kVocab);
  return d;
}

RunResult run(const Layout& l, const World& world, int steps = kSteps) {
  return train(l, world, data().dir, steps);
}

const RunResult& reference() {
  static const RunResult r = run(Layout{}, World{});
  return r;
}

std::string describe(const Layout& l) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "dp %d x tp %d%s x cp %d (%s) x pp %d, ZeRO-%d, recompute %s", l.dp, l.tp,
                l.sp ? " + SP" : "", l.cp, l.cp_impl.c_str(), l.pp, l.zero, l.recompute.c_str());
  return buf;
}

// Trains `l` (which must fill the world) and checks it against the one-rank run.
void check_layout(const Layout& l, const World& world) {
  REQUIRE(l.ranks() == world.size);
  INFO(describe(l));
  const RunResult r = run(l, world);
  check_parity(r, reference());
  check_tied_copies(r, l, world);
}

Layout layout(int dp, int tp, int cp, bool sp = false, const char* cp_impl = "ring", int pp = 1, int zero = 0) {
  Layout l;
  l.dp = dp;
  l.tp = tp;
  l.cp = cp;
  l.sp = sp;
  l.cp_impl = cp_impl;
  l.pp = pp;
  l.zero = zero;
  return l;
}

}  // namespace

TEST_CASE("tensor and context parallel over two ranks train like one rank", "[mpi][tp][cp]") {
  const World world = whole_world();
  if (world.size != 2) return;
  check_layout(layout(1, 2, 1), world);
  check_layout(layout(1, 2, 1, true), world);
  check_layout(layout(1, 1, 2), world);
  check_layout(layout(1, 1, 2, false, "ulysses"), world);
}

TEST_CASE("tp, cp and dp combined over four ranks train like one rank", "[mpi][tp][cp]") {
  const World world = whole_world();
  if (world.size != 4) return;
  check_layout(layout(1, 4, 1), world);
  check_layout(layout(1, 4, 1, true), world);
  check_layout(layout(1, 1, 4), world);
  check_layout(layout(1, 2, 2), world);
  check_layout(layout(1, 2, 2, true, "ulysses"), world);
  check_layout(layout(2, 2, 1), world);
  check_layout(layout(2, 2, 1, true, "ring", 1, 1), world);
  check_layout(layout(2, 2, 1, true, "ring", 1, 3), world);
  check_layout(layout(2, 1, 2), world);
  check_layout(layout(2, 1, 2, false, "ulysses", 1, 2), world);
}

TEST_CASE("activation recompute changes no bit under tp2 x cp2", "[mpi][tp][cp][recompute]") {
  const World world = whole_world();
  if (world.size != 4) return;
  check_recompute_is_bitwise(layout(1, 2, 2, true), world, data().dir, 3);
}

TEST_CASE("checkpoints reshard: tp2 x cp2 -> tp1 and tp1 -> tp2 x cp2", "[mpi][tp][cp][ckpt]") {
  const World world = whole_world();
  if (world.size != 4) return;
  check_reshard_with_one_rank(layout(1, 2, 2, true), world, data().dir, "tp2sp_cp2", reference());
  check_reshard_with_one_rank(layout(1, 2, 2, false, "ulysses"), world, data().dir, "tp2_cp2u", reference());
}

TEST_CASE("4-D layouts over eight ranks train like one rank", "[mpi][tp][cp][pipeline]") {
  const World world = whole_world();
  if (world.size != 8) return;
  Layout dtp = layout(2, 2, 1, true, "ring", 2, 1);  // dp2 x tp2 (+ SP) x pp2, ZeRO-1
  check_layout(dtp, world);
  Layout tcp = layout(1, 2, 2, false, "ring", 2);  // tp2 x cp2 x pp2, interleaved
  tcp.schedule = "interleaved";
  tcp.v = 2;
  check_layout(tcp, world);
}

TEST_CASE("activation memory from the shapes equals what the stages allocate under tp, sp and cp",
          "[mpi][tp][cp][memory]") {
  const World world = whole_world();
  if (world.size > 4) return;  // 4 heads: tp <= 4
  std::vector<Layout> layouts = {layout(1, world.size, 1), layout(1, world.size, 1, true), layout(1, 1, world.size),
                                 layout(1, 1, world.size, false, "ulysses")};
  if (world.size == 4) layouts.push_back(layout(1, 2, 2, true));
  for (const Layout& l : layouts) {
    INFO(describe(l));
    check_activation_memory(l, world, data().dir);
  }
}
