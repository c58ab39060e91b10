// ZeRO over two ranks (mpirun -np 2; one rank: test_zero.cpp).
//
// One shard per rank (tp 2, pp 2, or HSDP's 2 replicas of one shard): every ZeRO stage keeps
// ZeRO-0's buffers and nothing more (the shard is the whole arena) and trains bit for bit like
// ZeRO-0 of the same layout, including the tied embedding's sum over the pipeline's ends and the
// replicas' all-reduce.
//
// Two shards (dp 2): the memory plan is what a rank really allocates, byte for byte (the CPU
// backend's memory_use() counts exactly the tensors of Ops::alloc):
//  - ZeRO 0 and 1 hold everything for the whole run: after a step the live bytes ARE the plan's
//    total, and so is the peak (the step allocates nothing that it frees again).
//  - ZeRO 2 and 3 allocate each layer's working buffers during the step and free them: the peak
//    is the plan's total and the live bytes after the step are the total less those buffers
//    (the plan's params_working and grads_working), except the reduced-gradient piece, which
//    GradSync keeps for the whole run.
//  - The one named extra is ZeRO-3's plan, which stays an upper bound: it counts the embeddings'
//    gathered parameters as held together with the largest other layer's, but training gathers
//    them for the tied head around the forward/backward turn and releases them before the
//    blocks' backward, so the real peak is lower by exactly the embeddings' bucket.
#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "core/model/shard_layout.h"
#include "core/plan/stage_memory.h"
#include "core/train/memory_plan.h"
#include "mpi_trainer_parity.h"

using namespace pt;
using namespace pt::test;

namespace {

const SharedShards& data() {
  static const SharedShards d("mpi_zero", 5, 20000, 3000, kVocab);
  return d;
}

struct Run {
  RunResult result;
  MemoryUse memory;  // after the steps
};

Run run(const Layout& l, int dp_replicate, const World& world) {
  RunConfig cfg = parity_config(l, data().dir);
  cfg.parallel.dp_replicate = dp_replicate;
  CpuOps ops;
  Trainer t(cfg, world, ops);
  Run r;
  r.result = collect(t, 4);
  r.memory = ops.memory_use();
  return r;
}

}  // namespace

TEST_CASE("one shard per rank: ZeRO 1-3 hold and compute exactly what ZeRO-0 does", "[mpi][zero]") {
  const World world = whole_world();
  if (world.size != 2) return;
  struct Case {
    const char* name;
    int tp, pp, dp, dp_replicate;
  };
  for (const Case& c : {Case{"tp 2", 2, 1, 1, 1}, Case{"pp 2", 1, 2, 1, 1}, Case{"dp 2 = 2 replicas x 1 shard", 1, 1, 2, 2}}) {
    Layout l;
    l.tp = c.tp;
    l.pp = c.pp;
    l.dp = c.dp;
    const Run zero0 = run(l, c.dp_replicate, world);
    for (int stage : {1, 2, 3}) {
      INFO(c.name << ", ZeRO-" << stage);
      l.zero = stage;
      const Run r = run(l, c.dp_replicate, world);
      CHECK(r.memory.live == zero0.memory.live);
      CHECK(r.memory.peak == zero0.memory.peak);
      REQUIRE(r.result.steps.size() == zero0.result.steps.size());
      for (size_t s = 0; s < r.result.steps.size(); s++) {
        INFO("step " << s + 1);
        CHECK(r.result.steps[s].loss == zero0.result.steps[s].loss);
        CHECK(r.result.steps[s].grad_norm == zero0.result.steps[s].grad_norm);
      }
      CHECK(r.result.weights == zero0.result.weights);
      CHECK(r.result.val_loss == zero0.result.val_loss);
    }
  }
}

TEST_CASE("the memory plan is what a rank really allocates (dp 2, fp32)", "[mpi][zero][memory]") {
  const World world = whole_world();
  if (world.size != 2) return;
  for (int stage : {0, 1, 2, 3})
    for (const char* recompute : {"none", "selective", "full"}) {
      INFO("ZeRO-" << stage << ", recompute " << recompute);
      Layout l;
      l.dp = 2;
      l.zero = stage;
      l.recompute = recompute;
      const RunConfig cfg = parity_config(l, data().dir);
      const ParamTable table = build_param_table(cfg.model);
      const MemoryPlan plan = plan_stage_memory(cfg, table, DType::f32).at(0).plan;
      const ShardLayout layout(table, stage, 2, world.rank, bucket_cap_elements(cfg.parallel.grad_bucket_mb));
      const size_t embeddings = sizeof(float) * layout.bucket_of_layer(layout.first_layer()).padded;
      CpuOps ops;
      {
        Trainer t(cfg, world, ops);
        t.step();
        const MemoryUse use = ops.memory_use();
        if (stage <= 1) {
          CHECK(use.live == plan.total());
          CHECK(use.peak == plan.total());
        } else {
          const size_t working = plan.params_working + plan.grads_working - sizeof(float) * layout.largest_piece_numel();
          CHECK(working > 0);
          CHECK(use.live == plan.total() - working);
          CHECK(use.peak == plan.total() - (stage == 3 ? embeddings : 0));
        }
      }
      CHECK(ops.memory_use().live == 0);  // the trainer released everything it allocated
    }
}
