// run.cuda_graphs on the CPU: which runs may record their work (cuda_graphs_blocker), the host
// bookkeeping a replay stands in for (DecoderStage::HostMarks), AdamW's step scalars read from
// memory (what a recorded update replays with), and a refused recording (the CPU backend's
// Ops::record) leaving the step, and the optimizer's update, as if graphs had never been asked for. The recordings
// and their replays run on a GPU: test/gpu_graphs.cpp.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu/cpu_ops.h"
#include "core/dist/local_comm.h"
#include "core/model/decoder_stage.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/train/cuda_graphs.h"
#include "core/train/optimizer.h"
#include "core/train/pipeline_executor.h"
#include "test/ckpt_test_support.h"
#include "test/cpu_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

// A Llama whose every block is sparse (kTinyMoe) or a GPT-2, 2 x 16 tokens per micro-batch,
// 3 micro-batches a step.
RunConfig tiny(const CkptFixture& fx, bool experts) {
  std::vector<std::string> sets = {"batch.global_batch_tokens=96", "run.cuda_graphs=true"};
  if (experts) sets = with(with(sets, {"model.arch=llama", "model.n_kv_heads=1"}), kTinyMoe);
  return fx.config(sets);
}

std::vector<float> initial_params(const ParamTable& table, uint64_t seed) {
  std::vector<float> init(table.total_numel());
  init_params(table, seed, init.data());
  return init;
}

std::vector<float> master_weights_of(const ParamStore& store) {
  std::vector<float> w(store.table().total_numel());
  store.save_master(w.data());
  return w;
}

}  // namespace

TEST_CASE("run.cuda_graphs records only where nothing stands in the way", "[graphs]") {
  CkptFixture fx("graphs_blocker");
  RunConfig c = tiny(fx, false);
  CHECK(cuda_graphs_blocker(c, Device::cuda).empty());
  CHECK_THAT(cuda_graphs_blocker(c, Device::cpu), Catch::Contains("cpu backend runs each op"));
  c.precision.fp8 = "tensorwise";  // no state from step to step
  CHECK(cuda_graphs_blocker(c, Device::cuda).empty());
  c.precision.fp8 = "delayed";
  CHECK_THAT(cuda_graphs_blocker(c, Device::cuda), Catch::Contains("precision.fp8=delayed"));
  c.precision.fp8 = "off";
  // Collectives inside forward and backward.
  for (const char* degree : {"tp", "cp", "ep"}) {
    INFO(degree);
    RunConfig l = c;
    ParallelSection& p = l.parallel;
    (std::string(degree) == "tp" ? p.tp : std::string(degree) == "cp" ? p.cp : p.ep) = 2;
    CHECK_THAT(cuda_graphs_blocker(l, Device::cuda), Catch::Contains("talk to other ranks inside forward and backward"));
  }
  // Data parallel: ZeRO 0-1 with several micro-batches records all but the last one's work;
  // ZeRO 2-3 over several ranks, or a single micro-batch, reduce inside every recordable backward.
  RunConfig dp = c;
  dp.parallel.dp = 2;
  REQUIRE(dp.batch.grad_accum_steps == 3);
  for (int zero : {0, 1}) {
    dp.parallel.zero_stage = zero;
    CHECK(cuda_graphs_blocker(dp, Device::cuda).empty());
  }
  for (int zero : {2, 3}) {
    dp.parallel.zero_stage = zero;
    CHECK_THAT(cuda_graphs_blocker(dp, Device::cuda), Catch::Contains("over 2 ranks reduces"));
  }
  dp.parallel.dp_replicate = 2;  // HSDP, one shard a replica: ZeRO-3 uses each whole layer in place
  CHECK(cuda_graphs_blocker(dp, Device::cuda).empty());
  dp.parallel.zero_stage = 1;
  dp.parallel.dp_replicate = 1;
  dp.batch.grad_accum_steps = 1;
  CHECK_THAT(cuda_graphs_blocker(dp, Device::cuda), Catch::Contains("one micro-batch a step"));
  // Pipeline parallel: each stage's computations are recorded, its messages run between them.
  RunConfig pp = c;
  pp.parallel.pp = 2;
  CHECK(cuda_graphs_blocker(pp, Device::cuda).empty());

  // On the CPU backend the trainer never turns them on, and trains as without the key.
  CpuOps ops_a, ops_b;
  Trainer with_key(c, World{}, ops_a);
  RunConfig plain_cfg = c;
  plain_cfg.run.cuda_graphs = false;
  plain_cfg.run.out_dir = (fx.dir / "plain").string();
  Trainer plain(plain_cfg, World{}, ops_b);
  for (int s = 0; s < 3; s++) {
    const StepResult a = with_key.step(), b = plain.step();
    CHECK(a.loss == b.loss);
    CHECK(a.grad_norm == b.grad_norm);
  }
  CHECK_FALSE(with_key.pipeline().graphs_on());
  CHECK(with_key.pipeline().graphs_recorded() == 0);
  CHECK(master_weights(with_key) == master_weights(plain));
}

TEST_CASE("a replay's host marks are those its work's host code leaves", "[graphs]") {
  CkptFixture fx("graphs_marks");
  for (const bool experts : {false, true}) {
    DYNAMIC_SECTION((experts ? "llama with experts" : "gpt-2")) {
      const RunConfig c = tiny(fx, experts);
      const ModelSection& m = c.model;
      CpuOps ops;
      const ParamTable table = build_param_table(m);
      const std::vector<float> init = initial_params(table, 5);
      ParamStore store(table, ops);
      store.load_master(init.data());
      const int B = c.batch.micro_batch_size, T = c.batch.seq_len, N = B * T;
      DecoderStage stage(m, store, ops, B, T, pipeline_chunks(m, c.parallel, 0)[0], StageSlots{2, 2},
                         Recompute::none);
      const std::vector<int32_t> tok = random_tokens(N, m.vocab_size, 1), tgt = random_tokens(N, m.vocab_size, 2);
      const float dloss = 1.0f / N;
      const MicroSlot at{1, 1};

      const DecoderStage::HostMarks m0 = stage.host_marks();
      stage.forward(at, tok.data(), tgt.data(), dloss);
      const DecoderStage::HostMarks m1 = stage.host_marks();
      CHECK(m1.backward_due == std::vector<bool>{false, true});
      CHECK(m1.moe_batches == (experts ? m.n_layers : 0));
      stage.restore(m0);
      CHECK(stage.host_marks() == m0);
      stage.after_replay(true, at, dloss);
      CHECK(stage.host_marks() == m1);

      stage.backward(at);
      const DecoderStage::HostMarks m2 = stage.host_marks();
      CHECK(m2.backward_due == std::vector<bool>{false, false});
      stage.restore(m1);
      stage.after_replay(false, at, dloss);
      CHECK(stage.host_marks() == m2);

      // An evaluation forward leaves nothing due and counts no training forward.
      stage.forward(at, tok.data(), tgt.data(), 0.0f);
      CHECK(stage.host_marks() == m2);
      stage.after_replay(true, at, 0.0f);
      CHECK(stage.host_marks() == m2);
      // A replayed backward with nothing due is a bookkeeping error, not silently accepted.
      CHECK_THROWS_WITH(stage.after_replay(false, at, dloss), Catch::Contains("out of order"));
    }
  }
}

TEST_CASE("a recording the backend refuses leaves the step as it would have been", "[graphs]") {
  CkptFixture fx("graphs_refused");
  const RunConfig c = tiny(fx, true);
  const ParamTable table = build_param_table(c.model);
  const std::vector<float> init = initial_params(table, 9);
  const int m = c.batch.grad_accum_steps;
  REQUIRE(m == 3);
  const size_t N = size_t(c.batch.micro_batch_size) * c.batch.seq_len;
  const std::vector<int32_t> tok = random_tokens(m * N, c.model.vocab_size, 3),
                             tgt = random_tokens(m * N, c.model.vocab_size, 4);
  struct Run {
    PipelineStepStats stats;
    std::vector<float> grads;
    std::string fallback;
    bool still_on = false;
  };
  auto run = [&](bool graphs) {
    CpuOps ops;
    ParamStore store(table, ops);
    store.load_master(init.data());
    PipelineExecutor ex(c, 0, store, ops);
    LocalComm pp(0, ops);
    ex.connect(pp, nullptr);
    ex.use_graphs(graphs);
    Run r;
    r.stats = ex.train_step(tok.data(), tgt.data(), 1.0f / (m * N));
    r.grads.resize(table.total_numel());
    ops.download(r.grads.data(), DType::f32, store.all_grads(), r.grads.size());
    r.fallback = ex.take_graph_fallback();
    r.still_on = ex.graphs_on();
    CHECK(ex.graphs_recorded() == 0);
    CHECK(ex.graph_replays() == 0);
    return r;
  };
  const Run plain = run(false), refused = run(true);
  CHECK(plain.fallback.empty());
  CHECK_THAT(refused.fallback, Catch::Contains("the forward of micro-batch 0 could not be recorded: the cpu backend"));
  CHECK_FALSE(refused.still_on);
  CHECK(refused.stats.loss_sum == plain.stats.loss_sum);
  CHECK(refused.stats.tokens == plain.stats.tokens);
  CHECK(refused.stats.tokens == double(m * N));
  CHECK(plain.stats.loss_sum > 0);
  CHECK(refused.grads == plain.grads);
}

TEST_CASE("AdamW reads its step's scalars from memory as it would take them as arguments", "[graphs]") {
  // Ops::adamw_update's `step`: what a recorded update replays with. Two identical states, one
  // updated with the scalars as arguments, the other from an AdamwStepScalars in a tensor.
  CpuOps ops;
  const size_t n = 1000;
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> init(5 * n);
  for (auto& x : init) x = normal(rng);
  for (size_t i = 3 * n; i < 5 * n; i++) init[i] = std::fabs(init[i]);  // v >= 0
  auto state = [&] {
    Tensor t = ops.alloc(5 * n, DType::f32);
    ops.upload(t, init.data(), DType::f32, t.numel);
    return t;
  };
  Tensor a = state(), b = state();
  const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.5f;
  const int t = 7;
  auto parts = [&](Tensor s) { return std::array<Tensor, 4>{s.slice(0, n), s.slice(n, n), s.slice(2 * n, n), s.slice(3 * n, n)}; };
  const auto pa = parts(a), pb = parts(b);
  // master, grad, m, v; the CPU's params are the master (an empty params tensor: none to write)
  ops.adamw_update(Tensor{}, pa[0], pa[1], pa[2], pa[3], n, lr, b1, b2, eps, wd, t, scale);
  Tensor step = ops.alloc(4, DType::f32);
  const AdamwStepScalars s = adamw_step_scalars(lr, b1, b2, t, scale);
  ops.upload(step, &s, DType::f32, 4);
  // The arguments are ignored when `step` is given (here deliberately wrong).
  ops.adamw_update(Tensor{}, pb[0], pb[1], pb[2], pb[3], n, 1.0f, b1, b2, eps, wd, 0, 9.0f, step);
  std::vector<float> ha(5 * n), hb(5 * n);
  ops.download(ha.data(), DType::f32, a, ha.size());
  ops.download(hb.data(), DType::f32, b, hb.size());
  CHECK(ha == hb);
  CHECK(ha != init);  // the update moved the master weights and moments
  for (Tensor* x : {&a, &b, &step}) ops.release(*x);
}

TEST_CASE("an optimizer update the backend refuses to record runs op by op, the same bits", "[graphs]") {
  CkptFixture fx("graphs_optimizer");
  const RunConfig c = tiny(fx, false);
  const ParamTable table = build_param_table(c.model);
  const std::vector<float> init = initial_params(table, 4);
  auto run = [&](bool graphs) {
    CpuOps ops;
    ParamStore store(table, ops);
    store.load_master(init.data());
    std::vector<float> grads(table.total_numel());
    std::mt19937 rng(6);
    std::normal_distribution<float> normal(0.0f, 1e-2f);
    for (auto& g : grads) g = normal(rng);
    ops.upload(store.all_grads(), grads.data(), DType::f32, grads.size());
    OptimizerGraphs recorded(ops);
    recorded.use(graphs);
    const OptimizerStats s = adamw_step(ops, store, c.optim, 1e-3, 1, nullptr, {}, nullptr, {}, &recorded);
    CHECK(s.updated);
    CHECK_FALSE(recorded.on());
    CHECK(recorded.recorded() == 0);
    CHECK(recorded.replays() == 0);
    const std::string why = recorded.take_fallback();
    if (graphs) CHECK_THAT(why, Catch::Contains("the optimizer's update could not be recorded: the cpu backend"));
    else CHECK(why.empty());
    return master_weights_of(store);
  };
  const std::vector<float> plain = run(false), refused = run(true);
  CHECK(refused == plain);
  CHECK(plain != init);
}
