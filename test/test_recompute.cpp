// Activation recompute (recompute.mode): selective and full rebuild in backward what mode none
// keeps, with the same kernels on the same inputs, so the gradients are bitwise those of none;
// and the activation memory shrinks by exactly what the memory plan says.
#include <catch2/catch.hpp>

#include <random>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
#include "core/model/decoder_stage.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/train/memory_plan.h"

using namespace pt;

namespace {

ModelSection small_model() {
  ModelSection m;
  m.n_layers = 3;
  m.d_model = 24;
  m.n_heads = 3;
  m.vocab_size = 61;
  m.pad_vocab_multiple = 16;
  m.padded_vocab = 64;
  m.max_seq_len = 16;
  return m;
}

constexpr int kB = 2, kT = 12, kN = kB * kT, kMicro = 3;

struct Result {
  std::vector<double> losses;
  std::vector<float> grads;                    // every parameter's gradient, table order
  std::vector<std::vector<float>> grad_input;  // per micro-batch (a stage without embedding)
};

// Three micro-batches of one chunk, all forwarded before any is backwarded (three slots, AFAB
// order: the slots' kept activations must survive the others' forwards and recomputes).
Result run(const ModelSection& m, const StageLayers& layers, Recompute mode) {
  CpuOps ops;
  const ParamTable table = build_param_table(m);
  std::vector<float> init(table.total_numel());
  init_params(table, 17, init.data());
  ParamStore store(table, ops);
  store.load_master(init.data());
  DecoderStage stage(m, store, ops, kB, kT, layers, StageSlots{kMicro, kMicro}, mode);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Result r;
  for (int k = 0; k < kMicro; k++) {
    std::vector<int32_t> tok(kN), tgt(kN);
    for (auto& t : tok) t = rng() % m.vocab_size;
    for (auto& t : tgt) t = rng() % m.vocab_size;
    if (!layers.embedding) {
      std::vector<float> x(static_cast<size_t>(kN) * m.d_model);
      for (auto& v : x) v = normal(rng);
      ops.upload(stage.input(k), x.data(), DType::f32, x.size());
    }
    r.losses.push_back(stage.forward({k, k}, tok.data(), tgt.data(), 1.0f / (kMicro * kN)));
  }
  for (int k = 0; k < kMicro; k++) {
    if (!layers.head) {
      std::vector<float> dy(static_cast<size_t>(kN) * m.d_model);
      for (auto& v : dy) v = 1e-3f * normal(rng);
      ops.upload(stage.grad_output(k), dy.data(), DType::f32, dy.size());
    }
    stage.backward({k, k});
    if (!layers.embedding) {
      std::vector<float> dx(static_cast<size_t>(kN) * m.d_model);
      ops.download(dx.data(), DType::f32, stage.grad_input(k), dx.size());
      r.grad_input.push_back(std::move(dx));
    }
  }
  r.grads.resize(table.total_numel());
  ops.download(r.grads.data(), DType::f32, store.all_grads(), r.grads.size());
  return r;
}

}  // namespace

TEST_CASE("recompute none, selective and full give bitwise identical gradients", "[recompute]") {
  const ModelSection m = small_model();
  const std::vector<StageLayers> chunks = {
      whole_model_layers(m),              // embeddings + every block + head
      {1, 3, false, false, 1},            // a middle stage: activation in, activation out
      {0, 1, true, false, 0},             // the first stage of a pipeline
      {2, 3, false, true, 2},             // the last
  };
  for (const StageLayers& layers : chunks) {
    INFO(layers.describe());
    const Result none = run(m, layers, Recompute::none);
    bool any_grad = false;
    for (float g : none.grads) any_grad = any_grad || g != 0.0f;
    CHECK(any_grad);
    for (Recompute mode : {Recompute::selective, Recompute::full}) {
      INFO("recompute " << to_string(mode));
      const Result r = run(m, layers, mode);
      CHECK(r.losses == none.losses);
      CHECK(r.grads == none.grads);  // bitwise
      CHECK(r.grad_input == none.grad_input);
    }
  }
}

TEST_CASE("recompute shrinks the activations by what the memory plan counts", "[recompute][memory]") {
  const ModelSection m = small_model();
  CpuOps ops;
  const ParamTable table = build_param_table(m);
  ParamStore store(table, ops);
  for (const StageLayers& layers : {whole_model_layers(m), StageLayers{1, 3, false, false, 1},
                                    StageLayers{0, 2, true, false, 0}, StageLayers{2, 3, false, true, 2}})
    for (StageSlots slots : {StageSlots{1, 1}, StageSlots{4, 3}}) {
      size_t bytes[3];
      for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
        INFO(layers.describe() << ", " << slots.io << " + " << slots.activations << " slots, recompute "
                               << to_string(mode));
        const DecoderStage stage(m, store, ops, kB, kT, layers, slots, mode);
        CHECK(decoder_activation_bytes(m, kB, kT, DType::f32, layers, slots, mode) == stage.activation_bytes());
        bytes[static_cast<int>(mode)] = stage.activation_bytes();
      }
      // One block of one micro-batch only moves buffers from the slot to the shared set.
      const bool more = layers.layers() * slots.activations > 1;
      CHECK(bytes[0] >= bytes[1] + (more ? 1 : 0));
      CHECK(bytes[1] >= bytes[2] + (more ? 1 : 0));
    }
  // Per block and micro-batch in flight: none keeps 16 N*C + 4 N + B*NH*T floats (with the
  // block's output), selective 9 N*C, full N*C; the shared set grows by what is rebuilt.
  const StageLayers mid{0, 3, false, false, 0};
  auto per_set = [&](Recompute mode) {
    return decoder_activation_bytes(m, kB, kT, DType::f32, mid, {1, 2}, mode) -
           decoder_activation_bytes(m, kB, kT, DType::f32, mid, {1, 1}, mode);
  };
  const size_t NC = static_cast<size_t>(kN) * m.d_model, lse = static_cast<size_t>(kB) * m.n_heads * kT;
  // 3 blocks (the last one's output is the shared output buffer).
  CHECK(per_set(Recompute::none) == 4 * (3 * (15 * NC + 4 * kN + lse) + 2 * NC));
  CHECK(per_set(Recompute::selective) == 4 * (3 * 8 * NC + 2 * NC));
  CHECK(per_set(Recompute::full) == 4 * (2 * NC));
  // An I/O slot: the input and its gradient.
  CHECK(decoder_activation_bytes(m, kB, kT, DType::f32, mid, {2, 1}, Recompute::full) -
            decoder_activation_bytes(m, kB, kT, DType::f32, mid, {1, 1}, Recompute::full) ==
        4 * 2 * NC);
}

TEST_CASE("recompute.mode selects the mode; a bad one is refused", "[recompute]") {
  CHECK(parse_recompute("none") == Recompute::none);
  CHECK(parse_recompute("selective") == Recompute::selective);
  CHECK(parse_recompute("full") == Recompute::full);
  CHECK_THROWS_AS(parse_recompute("some"), ConfigError);
  nlohmann::json j = {{"data", {{"train", "x_*.bin"}}}, {"recompute", {{"mode", "full"}}}};
  CHECK(config_from_json(j, {}, 1).recompute.mode == "full");
  CHECK(config_from_json(j, {"recompute.mode=selective"}, 1).recompute.mode == "selective");
  CHECK(RunConfig{}.recompute.mode == "none");
}
