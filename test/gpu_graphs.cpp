// run.cuda_graphs on the GPU (PipelineExecutor::use_graphs, OptimizerGraphs, CudaOps::record): a
// run whose forwards, backwards and optimizer updates are recorded in its second step and
// replayed after (the update reading its step's scalars from the device) trains to the same
// bits as the run that launches every kernel: every step's loss, gradient norm and learning
// rate, and the master weights and both Adam moments at the end. Each model is run twice on
// fresh backends, once each way:
//  - GPT-2 in bf16 and in fp32 (two micro-batches a step, so each step replays four recordings);
//  - a Llama whose every block is sparse (kTinyMoe) in bf16 with selective recompute: the routing,
//    the balancing loss and the grouped expert products on the device, the recompute in backward,
//    and the sparse blocks' count of training forwards the trainer divides by;
//  - GPT-2 with FP8 products (tensorwise: no state from step to step), where the GPU has them.
// Step 4 of each run has a NaN loss gradient (InjectedFaults): the recordings hold the real one,
// so that step runs op by op, the guard skips its update, and step 5 replays again.
// And a recording the GPU refuses: the experts' fp32 products take the per-expert path, which
// reads the group sizes back (a wait a recording cannot hold), so the first recording fails; the
// run says why, goes on op by op from that same step and still trains to the plain run's bits.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ckpt_test_support.h"
#include "cuda/cuda_backend.h"
#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::test;
using pt::gputest::mode_name;

namespace {

constexpr int kSteps = 6, kNanStep = 4;

struct Run {
  std::vector<StepResult> steps;
  std::vector<float> state;  // full_state(): master weights and both moments
  bool graphs_on = false;
  int recorded = 0;
  long long replays = 0;
  int optimizer_recorded = 0;
  long long optimizer_replays = 0;
};

Run train(const CkptFixture& fx, const std::vector<std::string>& sets, DType mode, bool graphs, const std::string& name) {
  const std::unique_ptr<Ops> ops = make_cuda_ops(mode);
  std::vector<std::string> all = sets;
  all.push_back(std::string("precision.compute_dtype=") + mode_name(mode));
  all.push_back(std::string("run.cuda_graphs=") + (graphs ? "true" : "false"));
  Trainer t(fx.config(all, name), World{}, *ops);
  InjectedFaults f;
  f.nan_gradient = {kNanStep};
  t.inject_faults(f);
  Run r;
  for (int i = 0; i < kSteps; i++) r.steps.push_back(t.step());
  r.state = full_state(t, *ops);
  r.graphs_on = t.pipeline().graphs_on();
  r.recorded = t.pipeline().graphs_recorded();
  r.replays = t.pipeline().graph_replays();
  r.optimizer_recorded = t.optimizer_graphs().recorded();
  r.optimizer_replays = t.optimizer_graphs().replays();
  return r;
}

void check_same_bits(const Run& graphs, const Run& plain) {
  REQUIRE(graphs.steps.size() == plain.steps.size());
  for (size_t i = 0; i < plain.steps.size(); i++) {
    INFO("step " << i + 1);
    CHECK(graphs.steps[i].loss == plain.steps[i].loss);
    CHECK(graphs.steps[i].grad_norm == plain.steps[i].grad_norm);
    CHECK(graphs.steps[i].lr == plain.steps[i].lr);
    CHECK(graphs.steps[i].skipped == plain.steps[i].skipped);
    CHECK(plain.steps[i].skipped == (int(i) + 1 == kNanStep));
    if (!plain.steps[i].skipped) CHECK(std::isfinite(plain.steps[i].loss));
  }
  CHECK(same_bytes(graphs.state, plain.state));
}

std::vector<std::string> gpt2() { return {"model.d_model=128", "model.n_heads=2", "schedule.total_steps=6"}; }

std::vector<std::string> llama_experts() {
  return with(with(gpt2(), {"model.arch=llama", "model.n_kv_heads=1", "recompute.mode=selective"}), kTinyMoe);
}

}  // namespace

TEST_CASE("a run replaying CUDA graphs trains to the bits of one launching every kernel", "[gpu][graphs]") {
  struct Case {
    const char* name;
    std::vector<std::string> sets;
    DType mode;
    bool fp8;
  };
  const std::vector<Case> cases = {{"gpt2 bf16", gpt2(), DType::bf16, false},
                                   {"gpt2 fp32", gpt2(), DType::f32, false},
                                   {"llama + experts bf16, selective recompute", llama_experts(), DType::bf16, false},
                                   {"gpt2 bf16 + fp8 tensorwise", with(gpt2(), {"precision.fp8=tensorwise"}),
                                    DType::bf16, true}};
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      if (c.fp8 && !make_cuda_ops(c.mode)->supports_fp8()) {
        WARN("no FP8 tensor cores on this GPU: the FP8 case did not run");
        continue;
      }
      CkptFixture fx("gpu_graphs");
      const Run plain = train(fx, c.sets, c.mode, false, "plain");
      const Run graphs = train(fx, c.sets, c.mode, true, "graphs");
      check_same_bits(graphs, plain);
      // Not vacuous: the recordings were made and replayed. Two micro-batches a step, a forward
      // and a backward each: 4 recordings, replayed in steps 2..6 but the NaN step.
      const int m = fx.config(c.sets).batch.grad_accum_steps;
      REQUIRE(m == 2);
      CHECK(graphs.graphs_on);
      CHECK(graphs.recorded == 2 * m);
      CHECK(graphs.replays == 2LL * m * (kSteps - 2));
      // The optimizer's update: one recording (the one store), replayed in the same steps (the
      // NaN step's update is skipped by the guard).
      CHECK(graphs.optimizer_recorded == 1);
      CHECK(graphs.optimizer_replays == kSteps - 2);
      CHECK_FALSE(plain.graphs_on);
      CHECK(plain.replays == 0);
      CHECK(plain.optimizer_replays == 0);
    }
  }
}

TEST_CASE("a recording the GPU refuses leaves the run op by op, with the same bits", "[gpu][graphs]") {
  CkptFixture fx("gpu_graphs_refused");
  const Run plain = train(fx, llama_experts(), DType::f32, false, "plain");
  const Run refused = train(fx, llama_experts(), DType::f32, true, "refused");
  check_same_bits(refused, plain);
  CHECK_FALSE(refused.graphs_on);
  CHECK(refused.recorded == 0);
  CHECK(refused.replays == 0);
  CHECK(refused.optimizer_replays == 0);  // the trainer turned both off
}
