// Mixture of experts (a Mixtral-style Llama: every block's MLP is 4 routed SwiGLU experts, top-2,
// with the load-balancing loss in the objective) trains exactly like one rank under every
// layout, as the dense Llama does (mpi_llama.cpp): the same tiny shape (8 blocks, d_model 16,
// 4 query heads over 2 K/V heads). Routing is discrete, so parity also proves that every layout
// routes every token to the same experts: one token sent elsewhere moves the loss far more than
// 1e-5. Run under mpirun with 2 and 4 ranks:
//   2 ranks: dp2 (ZeRO-0, ZeRO-3), tp2, tp2 + SP (each rank routes its own rows: the experts'
//            gradients and the balancing statistics are summed over tp), cp2 ring, cp2 Ulysses,
//            pp2 1F1B, and a model with sparse blocks every other block and a shared expert
//            (tensor-parallel like a dense MLP) under tp2 + SP;
//   4 ranks: tp2 x cp2 (+ SP), dp2 x tp2 (+ SP, ZeRO-1), pp2 x dp2 (AFAB, ZeRO-2), pp4
//            interleaved; recompute changes no bit under tp2 x cp2 (the routed experts keep
//            their activations); checkpoints reshard tp2 x cp2 <-> one rank and dp4 with ep 2
//            <-> one rank; the activation memory the stages allocate equals the plan's formula.
// Expert parallel (groups of ep dp ranks exchanging the routed rows all-to-all): 2 ranks: ep 2
// (ZeRO-0 and ZeRO-3; and sparse every other block with a shared expert); 4 ranks: ep 4, ep 2 x 2
// groups (ZeRO-1), ep 2 with tp 2 + SP, with cp 2, with pp 2.
// Each layout's loss, gradient norm, balancing loss and busiest-expert load per step, its
// validation loss and its final weights agree with the one-rank run within 1e-5 relative.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <algorithm>

#include "core/model/expert_split.h"
#include "mpi_trainer_parity.h"

using namespace pt;
using namespace pt::test;

namespace {

const SharedShards& data() {
  static const SharedShards d("mpi_moe", 17, 20000, 3000, kVocab);
  return d;
}

Layout moe(int dp, int tp, int cp, int pp = 1) {
  return grid(dp, tp, cp, pp).with([](Layout& l) {
    l.arch = "llama";
    l.lr = 3e-3;  // as mpi_llama.cpp: Adam would amplify float-order differences at 1e-2
    l.experts = 4;
    l.top_k = 2;
  });
}

// The one-rank runs: every block sparse; or every other block sparse with a shared expert.
const RunResult& reference(bool mixed = false) {
  static const RunResult all_sparse = train(moe(1, 1, 1), World{}, data().dir);
  static const RunResult with_shared = train(moe(1, 1, 1).with_moe_every(2, 1), World{}, data().dir);
  return mixed ? with_shared : all_sparse;
}

// With the balancing loss and load (check_parity).
void check(const Layout& l, const World& world) {
  check_trains_like(l, world, data().dir, reference(l.moe_every != 1));
}

}  // namespace

TEST_CASE("moe: the one-rank run trains and balances its experts", "[mpi][moe]") {
  for (bool mixed : {false, true}) {
    const RunResult& r = reference(mixed);
    INFO((mixed ? "sparse every other block, one shared expert" : "every block sparse"));
    REQUIRE(r.steps.size() == static_cast<size_t>(kSteps));
    for (const StepResult& s : r.steps) {
      CHECK(s.loss == Approx(std::log(kVocab)).epsilon(0.05));  // random tokens
      // aux = E sum_i f_i P_i is top_k when perfectly even, and at most E (all on one expert).
      CHECK(s.moe_aux >= 2.0 * 0.9);
      CHECK(s.moe_aux <= 4.0);
      CHECK(s.moe_max_load >= 1.0);
      CHECK(s.moe_max_load <= 2.0);  // E / top_k: every token on the same two experts
    }
  }
  const RunResult& r = reference();
  CHECK(r.weights.count("model.layers.0.block_sparse_moe.gate.weight") == 1);
  CHECK(r.weights.at("model.layers.3.block_sparse_moe.experts.3.w2.weight").size() == 16 * 24);
  CHECK(r.weights.count("model.layers.0.mlp.gate_proj.weight") == 0);
  const RunResult& m = reference(true);
  CHECK(m.weights.count("model.layers.0.mlp.gate_proj.weight") == 1);  // dense block 0
  CHECK(m.weights.count("model.layers.1.mlp.shared_experts.up_proj.weight") == 1);
  CHECK(m.weights.at("model.layers.1.mlp.shared_experts.up_proj.weight").size() == 24 * 16);
  CHECK(m.weights.count("model.layers.1.block_sparse_moe.experts.0.w1.weight") == 1);
  CHECK(m.weights.count("model.layers.0.block_sparse_moe.gate.weight") == 0);
}

TEST_CASE("moe over two ranks trains like one rank", "[mpi][moe]") {
  const World world = whole_world();
  if (world.size != 2) return;
  for (const Layout& l : {moe(2, 1, 1), moe(2, 1, 1).with_zero(3), moe(1, 2, 1), moe(1, 2, 1).with_sp(), moe(1, 1, 2),
                          moe(1, 1, 2).with_ulysses(), moe(1, 1, 1, 2), moe(1, 2, 1).with_sp().with_moe_every(2, 1)})
    check(l, world);
}

TEST_CASE("moe: expert parallel over two ranks trains like one rank", "[mpi][moe][ep]") {
  const World world = whole_world();
  if (world.size != 2) return;
  const Layout ep = moe(2, 1, 1).with_ep(2);
  // ZeRO-3: every rank's shard of every expert, gathered per block.
  for (const Layout& l : {ep, ep.with_zero(3), ep.with_moe_every(2, 1)}) check(l, world);
}

TEST_CASE("moe: expert parallel with tp, cp and pp over four ranks trains like one rank", "[mpi][moe][ep]") {
  const World world = whole_world();
  if (world.size != 4) return;
  check(moe(4, 1, 1).with_ep(4), world);                // one expert per rank
  check(moe(4, 1, 1).with_ep(2).with_zero(1), world);   // two groups of two
  check(moe(2, 2, 1).with_ep(2).with_sp(), world);
  check(moe(2, 1, 2).with_ep(2), world);
  check(moe(2, 1, 1, 2).with_ep(2), world);
  // The experts' ZeRO state sharded over the two ranks that hold the same experts, and gathered
  // per block (ZeRO-3); and HSDP, whose replicas reduce the experts' shards too.
  check(moe(4, 1, 1).with_ep(2).with_zero(3), world);
  check(moe(4, 1, 1).with_ep(2).with_zero(2).with_hsdp(2), world);
}

TEST_CASE("moe over four ranks trains like one rank", "[mpi][moe]") {
  const World world = whole_world();
  if (world.size != 4) return;
  for (const Layout& l : {moe(1, 2, 2).with_sp(), moe(2, 2, 1).with_sp().with_zero(1),
                          moe(2, 1, 1, 2).with_schedule("afab").with_zero(2), moe(1, 1, 1, 4).with_schedule("interleaved", 2)})
    check(l, world);
}

TEST_CASE("moe: recompute changes no bit, checkpoints reshard, memory is the plan's, under tp2 x cp2",
          "[mpi][moe][ckpt][memory]") {
  const World world = whole_world();
  if (world.size != 4) return;
  const Layout tcp = moe(1, 2, 2).with_sp();
  check_recompute_is_bitwise(tcp, world, data().dir, 3);
  check_reshard_with_one_rank(tcp, world, data().dir, "moe_tp2sp_cp2", reference());
  check_activation_memory(tcp, world, data().dir);
  // Expert parallel: ep 2 x dp 2 saves and resumes on one rank (no expert parallel), and back.
  const Layout ep = moe(4, 1, 1).with_ep(2);
  check_reshard_with_one_rank(ep, world, data().dir, "moe_ep2_dp4", reference());
  check_activation_memory(ep, world, data().dir);
  // The experts' shards of two ranks each.
  check_reshard_with_one_rank(ep.with_zero(3), world, data().dir, "moe_ep2_dp4_z3", reference());
}

TEST_CASE("moe: under expert parallel a rank stores only its own experts", "[mpi][moe][ep][memory]") {
  const World world = whole_world();
  if (world.size != 4) return;
  for (int zero : {0, 1, 2, 3}) {
    const Layout l = moe(4, 1, 1).with_ep(2).with_zero(zero);
    INFO(l.describe());
    const RunConfig cfg = parity_config(l, data().dir);
    CpuOps ops;
    Trainer t(cfg, world, ops);
    REQUIRE(t.expert_params() != nullptr);
    // Rank r (dp coordinate r) holds experts 2 (r % 2) and 2 (r % 2) + 1 of every block; the
    // dense store none.
    for (const ParamSpec& p : t.params().table().specs()) CHECK(!is_routed_expert(p));
    const ParamTable& mine = t.expert_params()->table();
    REQUIRE(mine.specs().size() == size_t(8) * 2 * 3);  // 8 blocks x 2 experts x (w1, w3, w2)
    for (const ParamSpec& p : mine.specs()) {
      const int first = 2 * (world.rank % 2);
      const bool own = p.name.find("experts." + std::to_string(first) + ".") != std::string::npos ||
                       p.name.find("experts." + std::to_string(first + 1) + ".") != std::string::npos;
      CHECK(own);
    }
    // Its ZeRO state is sharded over the two ranks that hold the same experts (dp 4 / ep 2).
    CHECK(t.expert_params()->layout().shard_count() == (zero == 0 ? 1 : 2));
    CHECK(t.groups().expert_dp_cp->size() == 2);
    // Half the experts' parameters (what the allocations come to is checked against the plan
    // above, and the plan's expert part in test_moe.cpp).
    size_t all_experts = 0;
    for (const ParamSpec& p : t.stage_table().specs()) all_experts += is_routed_expert(p) ? p.numel : 0;
    CHECK(mine.total_numel() * 2 == all_experts);
    // What the rank allocates is its plan's (the dense store's and the experts'; as mpi_zero.cpp
    // checks without experts): all of it held through the step under ZeRO 0-1; under ZeRO 2-3
    // all but the layers' working buffers after the step, and at most the plan in it.
    t.step();
    const MemoryPlan plan = plan_stage_memory(cfg, build_param_table(cfg.model), DType::f32).at(0).plan;
    CHECK(plan.experts > 0);
    const MemoryUse use = ops.memory_use();
    if (zero <= 1) {
      CHECK(use.live == plan.total());
      CHECK(use.peak == plan.total());
    } else {
      // GradSync keeps each store's largest reduced piece for the whole run.
      size_t pieces = 0;
      for (const ShardLayout* layout : {&t.params().layout(), &t.expert_params()->layout()}) {
        size_t largest = 0;
        for (const auto& b : layout->buckets()) largest = std::max(largest, layout->piece_numel(b));
        pieces += sizeof(float) * largest;
      }
      CHECK(use.live == plan.total() - (plan.params_working + plan.grads_working - pieces));
      CHECK(use.peak <= plan.total());
      CHECK(use.peak > use.live);
    }
  }
}
