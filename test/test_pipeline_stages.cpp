// Pipeline stages on one process: which blocks and parameters each pipeline rank holds (even
// split, interleaved chunks, parallel.pp_layers), how many activation slots its action list
// needs, and that a model cut into chunks computes the whole model's gradients bit for bit
// when the activations and gradients are handed from chunk to chunk (what the executor's
// messages do between ranks).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
#include "core/dist/local_comm.h"
#include "core/model/decoder_stage.h"
#include "core/model/pipeline_stages.h"
#include "core/train/pipeline_executor.h"
#include "core/train/pp_simulator.h"

using namespace pt;

namespace {

RunConfig config(int pp, int n_layers, const std::string& schedule = "1f1b", int v = 1,
                 std::vector<int> pp_layers = {}) {
  nlohmann::json j = {
      {"model", {{"n_layers", n_layers}, {"d_model", 16}, {"n_heads", 2}, {"vocab_size", 50}, {"max_seq_len", 16},
                 {"pad_vocab_multiple", 32}}},
      {"parallel", {{"pp", pp}, {"pp_schedule", schedule}, {"pp_virtual_stages", v}, {"pp_layers", pp_layers}}},
      {"batch", {{"micro_batch_size", 2}, {"seq_len", 8}, {"global_batch_tokens", 8 * 2 * 8}}},
      {"data", {{"train", "unused_*.bin"}}},
  };
  return config_from_json(j, {}, pp);
}

std::set<std::string> names(const ParamTable& t) {
  std::set<std::string> out;
  for (const auto& p : t.specs()) out.insert(p.name);
  return out;
}

}  // namespace

TEST_CASE("layers split evenly, by chunk, or as parallel.pp_layers lists", "[pipeline]") {
  SECTION("even: pp 4, 8 blocks") {
    const RunConfig c = config(4, 8);
    const auto r0 = pipeline_chunks(c.model, c.parallel, 0), r3 = pipeline_chunks(c.model, c.parallel, 3);
    REQUIRE(r0.size() == 1);
    CHECK(r0[0] == StageLayers{0, 2, true, false, 0});
    CHECK(pipeline_chunks(c.model, c.parallel, 1)[0] == StageLayers{2, 4, false, false, 1});
    CHECK(r3[0] == StageLayers{6, 8, false, true, 3});
    CHECK(r0[0].describe() == "embeddings + layers 0-1");
    CHECK(r3[0].describe() == "layers 6-7 + head");
  }
  SECTION("interleaved: chunk c of rank r is virtual stage c*pp + r") {
    const RunConfig c = config(2, 8, "interleaved", 2);
    const auto r0 = pipeline_chunks(c.model, c.parallel, 0), r1 = pipeline_chunks(c.model, c.parallel, 1);
    REQUIRE(r0.size() == 2);
    CHECK(r0[0] == StageLayers{0, 2, true, false, 0});
    CHECK(r0[1] == StageLayers{4, 6, false, false, 2});
    CHECK(r1[0] == StageLayers{2, 4, false, false, 1});
    CHECK(r1[1] == StageLayers{6, 8, false, true, 3});
  }
  SECTION("explicit: fewer blocks where the embeddings and the head are") {
    const RunConfig c = config(3, 8, "1f1b", 1, {2, 4, 2});
    CHECK(pipeline_layer_counts(c.model, c.parallel) == std::vector<int>{2, 4, 2});
    CHECK(pipeline_chunks(c.model, c.parallel, 1)[0] == StageLayers{2, 6, false, false, 1});
    CHECK(pipeline_chunks(c.model, c.parallel, 2)[0] == StageLayers{6, 8, false, true, 2});
  }
}

TEST_CASE("each stage holds only its parameters; the first and last both hold wte", "[pipeline]") {
  const RunConfig c = config(2, 4);
  const ParamTable full = build_param_table(c.model);
  const auto first = pipeline_chunks(c.model, c.parallel, 0), last = pipeline_chunks(c.model, c.parallel, 1);
  const ParamTable t0 = stage_param_table(full, first, 4), t1 = stage_param_table(full, last, 4);
  const auto n0 = names(t0), n1 = names(t1);
  CHECK(n0.count("wte"));
  CHECK(n0.count("wpe"));
  CHECK(n0.count("h.1.mlp.c_proj.bias"));
  CHECK_FALSE(n0.count("h.2.ln_1.weight"));
  CHECK_FALSE(n0.count("ln_f.weight"));
  CHECK(n1.count("wte"));  // the tied LM head's copy
  CHECK_FALSE(n1.count("wpe"));
  CHECK(n1.count("h.2.ln_1.weight"));
  CHECK(n1.count("ln_f.bias"));
  // Every parameter is in some stage, and only wte is in two.
  CHECK(t0.total_numel() + t1.total_numel() == full.total_numel() + full.get("wte").numel);
  CHECK_FALSE(is_tied_copy(t0.get("wte"), first));
  CHECK(is_tied_copy(t1.get("wte"), last));
  CHECK_FALSE(is_tied_copy(t1.get("ln_f.weight"), last));
  // The same specs in the same order: layer-contiguous (ShardLayout buckets whole layers).
  size_t at = 0;
  for (const auto& p : t1.specs()) {
    CHECK(p.offset == at);
    at += p.numel;
    CHECK(p.shape == full.get(p.name).shape);
  }
  // Initialisation keys on names: a stage's values are the full model's.
  std::vector<float> a(full.total_numel()), b(t1.total_numel());
  init_params(full, 9, a.data());
  init_params(t1, 9, b.data());
  for (const auto& p : t1.specs())
    CHECK(std::equal(b.begin() + p.offset, b.begin() + p.offset + p.numel, a.begin() + full.get(p.name).offset));
  // One stage holding everything is the full table itself.
  const RunConfig one = config(1, 4);
  const ParamTable whole = stage_param_table(full, pipeline_chunks(one.model, one.parallel, 0), 4);
  REQUIRE(whole.specs().size() == full.specs().size());
  for (size_t i = 0; i < whole.specs().size(); i++) CHECK(whole.specs()[i].offset == full.specs()[i].offset);
}

TEST_CASE("activation slots: what each schedule holds in flight", "[pipeline]") {
  for (const auto& [kind, v] : {std::pair{PipeSchedule::afab, 1}, std::pair{PipeSchedule::one_f_one_b, 1},
                                std::pair{PipeSchedule::interleaved, 2}}) {
    for (int pp : {2, 4})
      for (int m : {4, 8}) {
        const auto lists = pipeline_schedule_all_ranks(kind, pp, v, m);
        const PipeSimReport sim = simulate_pipeline(lists, v, m);
        REQUIRE(sim.ok());
        for (int r = 0; r < pp; r++) {
          INFO(to_string(kind) << " pp " << pp << " m " << m << " rank " << r);
          const std::vector<StageSlots> slots = pipeline_slots(lists[r], v);
          REQUIRE(slots.size() == static_cast<size_t>(v));
          int acts = 0;
          for (const StageSlots& s : slots) {
            acts += s.activations;
            // An I/O slot is taken from the receive to the send of the gradient, so at least as
            // long as an activation set (forward to backward); with one chunk at most one more
            // (the next input arriving before a backward; interleaved receives further ahead).
            CHECK(s.io >= s.activations);
            if (v == 1) CHECK(s.io <= s.activations + 1);
          }
          // Activation sets: the simulator's micro-batches in flight, counted per chunk.
          if (v == 1) CHECK(acts == sim.peak_in_flight[r]);
          CHECK(acts >= sim.peak_in_flight[r]);
          if (kind == PipeSchedule::afab) CHECK(slots[0].activations == m);
          if (kind == PipeSchedule::one_f_one_b) CHECK(slots[0].activations == std::min(pp - r, m));
        }
      }
  }
  // One rank: one micro-batch at a time.
  CHECK(pipeline_slots(pipeline_schedule(PipeSchedule::one_f_one_b, 1, 1, 8, 0), 1) ==
        std::vector<StageSlots>{StageSlots{1, 1}});
}

TEST_CASE("a model cut into chunks computes the whole model's gradients, bit for bit", "[pipeline]") {
  const RunConfig c = config(2, 4, "afab", 1, {1, 3});
  const ModelSection& m = c.model;
  CpuOps ops;
  const ParamTable table = build_param_table(m);
  std::vector<float> init(table.total_numel());
  init_params(table, 3, init.data());
  const int B = 2, T = 8, N = B * T, micro = 3;
  std::mt19937 rng(5);
  std::vector<int32_t> tok(micro * N), tgt(micro * N);
  for (auto& t : tok) t = rng() % m.vocab_size;
  for (auto& t : tgt) t = rng() % m.vocab_size;
  const float dloss = 1.0f / (micro * N);

  // The whole model, 1F1B order on one rank.
  ParamStore whole_store(table, ops);
  whole_store.load_master(init.data());
  DecoderStage whole(m, whole_store, ops, B, T);
  double whole_loss = 0;
  for (int k = 0; k < micro; k++) {
    whole_loss += whole.forward(tok.data() + k * N, tgt.data() + k * N, dloss);
    whole.backward();
  }

  // Two chunks on one store (so the tied wte's two gradient contributions land in one buffer),
  // AFAB order with every micro-batch in its own slot, activations and gradients copied between.
  ParamStore store(table, ops);
  store.load_master(init.data());
  const auto a_layers = pipeline_chunks(m, c.parallel, 0)[0], b_layers = pipeline_chunks(m, c.parallel, 1)[0];
  DecoderStage a(m, store, ops, B, T, a_layers, {micro, micro}, Recompute::none);
  DecoderStage b(m, store, ops, B, T, b_layers, {micro, micro}, Recompute::selective);
  double loss = 0;
  for (int k = 0; k < micro; k++) {
    a.forward({k, k}, tok.data() + k * N, nullptr, dloss);
    ops.copy(b.input(k), a.output(), a.output().numel);
    loss += b.forward({k, micro - 1 - k}, nullptr, tgt.data() + k * N, dloss);  // any free set will do
  }
  for (int k = 0; k < micro; k++) {
    b.backward({k, micro - 1 - k});
    ops.copy(a.grad_output(k), b.grad_input(k), b.grad_input(k).numel);
    a.backward({k, k});
  }
  CHECK(loss == whole_loss);
  std::vector<float> g_whole(table.total_numel()), g(table.total_numel());
  ops.download(g_whole.data(), DType::f32, whole_store.all_grads(), g.size());
  ops.download(g.data(), DType::f32, store.all_grads(), g.size());
  // The wte gradient sums the head's and the embedding's parts in another order; every other
  // parameter's gradient is computed by exactly the same operations.
  const ParamSpec& wte = table.get("wte");
  for (const auto& p : table.specs()) {
    INFO(p.name);
    if (p.name == "wte") continue;
    CHECK(std::equal(g.begin() + p.offset, g.begin() + p.offset + p.numel, g_whole.begin() + p.offset));
  }
  double num = 0, den = 0;
  for (size_t i = wte.offset; i < wte.offset + wte.numel; i++) {
    num += (double(g[i]) - g_whole[i]) * (double(g[i]) - g_whole[i]);
    den += double(g_whole[i]) * g_whole[i];
  }
  CHECK(std::sqrt(num / den) < 1e-6);
}

TEST_CASE("the pipeline's evaluation forward on one rank is the whole model's", "[pipeline]") {
  RunConfig c = config(1, 2);
  CpuOps ops;
  const ParamTable table = build_param_table(c.model);
  std::vector<float> init(table.total_numel());
  init_params(table, 4, init.data());
  ParamStore s1(table, ops), s2(table, ops);
  s1.load_master(init.data());
  s2.load_master(init.data());
  PipelineExecutor ex(c, 0, s1, ops);
  LocalComm pp(0, ops);
  ex.connect(pp, nullptr);
  DecoderStage whole(c.model, s2, ops, 2, 8);
  std::vector<int32_t> tok(16), tgt(16);
  for (int i = 0; i < 16; i++) tok[i] = (i * 7) % 50, tgt[i] = (i * 3 + 1) % 50;
  CHECK(ex.forward_only(tok.data(), tgt.data()) == whole.forward(tok.data(), tgt.data(), 0.0f));
  CHECK(ex.has_embedding());
  CHECK(ex.has_head());
  CHECK(ex.slots() == std::vector<StageSlots>{StageSlots{1, 1}});
}
