// Multiple-choice scoring (Trainer::mc_row_losses, core/eval/mc_score.h) under data, tensor,
// pipeline and context parallel gives every ending's loss, and so acc and acc_norm, of one rank:
// the examples are split over the dp ranks, the rows' losses gathered on every rank. Run under
// mpirun with 2 and 4 ranks (test/CMakeLists.txt); every rank computes the one-rank reference
// itself (the same initial weights under every layout), on the parity tests' tiny GPT-2 and Llama.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <random>

#include "core/eval/mc_score.h"
#include "mpi_trainer_parity.h"

using namespace pt;
using namespace pt::test;

namespace {

const SharedShards& data() {
  static const SharedShards d("mpi_eval", 4, 4000, 1000, kVocab);
  return d;
}

// 11 examples of random ids (so the rows do not fill whole batches of every dp), contexts of 1-7
// tokens and endings of 1-3 (rows of kT = 8 inputs: the longest contexts are cut from the left).
McLayout task() {
  std::mt19937 rng(12);
  std::vector<McTokens> ex;
  for (int i = 0; i < 11; i++) {
    McTokens t;
    for (int k = 0; k < 1 + i % 7; k++) t.context.push_back(static_cast<int32_t>(rng() % kVocab));
    for (int e = 0; e < 4; e++) {
      t.endings.emplace_back();
      for (int k = 0; k < 1 + (i + e) % 3; k++) t.endings.back().push_back(static_cast<int32_t>(rng() % kVocab));
    }
    t.label = static_cast<int>(rng() % 4);
    ex.push_back(std::move(t));
  }
  return layout_mc_rows(ex, kT);
}

std::vector<double> row_losses(const Layout& l, const World& world) {
  const std::unique_ptr<Ops> ops = make_ops(Device::cpu, DType::f32);
  Trainer t(parity_config(l, data().dir), world, *ops);
  return t.mc_row_losses(task());
}

void check_scores_like_one_rank(const Layout& l, const World& world) {
  INFO(l.describe());
  REQUIRE(l.ranks() == world.size);
  Layout one = l;
  one.dp = one.tp = one.pp = one.cp = 1;
  one.sp = false;
  const McLayout rows = task();
  REQUIRE(rows.truncated > 0);
  const std::vector<double> want = row_losses(one, World{}), got = row_losses(l, world);
  REQUIRE(got.size() == want.size());
  for (size_t r = 0; r < got.size(); r++) {
    INFO("row " << r);
    CHECK(want[r] > 0);
    CHECK(got[r] == Approx(want[r]).epsilon(1e-5));
  }
  const McScores a = score_mc(rows, got), b = score_mc(rows, want);
  CHECK(a.correct == b.correct);
  CHECK(a.correct_norm == b.correct_norm);
  for (size_t x = 0; x < a.examples.size(); x++) {
    CHECK(a.examples[x].pred == b.examples[x].pred);
    CHECK(a.examples[x].pred_norm == b.examples[x].pred_norm);
  }
}

}  // namespace

TEST_CASE("multiple-choice losses under dp, tp, pp and cp over two ranks are one rank's", "[mpi][eval]") {
  const World world = whole_world();
  if (world.size != 2) return;
  Layout llama = grid(1, 2, 1);
  llama.arch = "llama";
  for (const Layout& l : {grid(2, 1, 1), grid(2, 1, 1).with_zero(3), grid(1, 2, 1).with_sp(), grid(1, 1, 1, 2),
                          grid(1, 1, 2), llama})
    check_scores_like_one_rank(l, world);
}

TEST_CASE("multiple-choice losses under dp x tp and tp x pp over four ranks are one rank's", "[mpi][eval]") {
  const World world = whole_world();
  if (world.size != 4) return;
  for (const Layout& l : {grid(2, 2, 1), grid(1, 2, 1, 2), grid(2, 1, 2)}) check_scores_like_one_rank(l, world);
}
