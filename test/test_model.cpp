// The GPT-2 model on the CPU backend: parameter table, initialisation, and that it learns.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "core/cpu/cpu_ops.h"
#include "core/model/decoder_stage.h"
#include "core/model/head_chunks.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/train/optimizer.h"

using namespace pt;

// A CpuOps-backed model: parameters initialised from `seed` on one rank.
struct CpuModel {
  CpuOps ops;
  ParamTable table;
  ParamStore store;
  CpuModel(const ModelSection& m, uint64_t seed) : table(build_param_table(m)), store(table, ops) {
    std::vector<float> host(table.total_numel());
    init_params(table, seed, host.data());
    store.load_master(host.data());
  }
};

static ModelSection small_model() {
  ModelSection m;
  m.n_layers = 2;
  m.d_model = 48;
  m.n_heads = 3;
  m.vocab_size = 61;
  m.pad_vocab_multiple = 16;
  m.padded_vocab = 64;
  m.max_seq_len = 32;
  return m;
}

TEST_CASE("GPT-2 124M parameter count matches llm.c", "[model]") {
  ModelSection m;  // defaults are GPT-2 small
  m.padded_vocab = 50304;
  const ParamTable t = build_param_table(m);
  // llm.c prints "num_parameters: 124475904" for the padded model.
  CHECK(t.total_numel() == 124475904);
  CHECK(t.get("wte").weight_decay);
  CHECK_FALSE(t.get("h.0.ln_1.weight").weight_decay);
  CHECK_FALSE(t.get("h.3.attn.c_attn.bias").weight_decay);
}

TEST_CASE("initialisation is a pure function of (seed, name, index)", "[model]") {
  const ModelSection m = small_model();
  const ParamTable t = build_param_table(m);
  std::vector<float> a(t.total_numel()), b(t.total_numel()), c(t.total_numel());
  init_params(t, 42, a.data());
  init_params(t, 42, b.data());
  init_params(t, 43, c.data());
  CHECK(a == b);
  CHECK(a != c);

  SECTION("std, ones, zeros and padded rows") {
    const ParamSpec& fc = t.get("h.1.mlp.c_fc.weight");
    double sum2 = 0;
    for (size_t i = 0; i < fc.numel; i++) sum2 += double(a[fc.offset + i]) * a[fc.offset + i];
    CHECK(std::sqrt(sum2 / fc.numel) == Approx(0.02).epsilon(0.05));
    const ParamSpec& proj = t.get("h.0.attn.c_proj.weight");
    sum2 = 0;
    for (size_t i = 0; i < proj.numel; i++) sum2 += double(a[proj.offset + i]) * a[proj.offset + i];
    CHECK(std::sqrt(sum2 / proj.numel) == Approx(0.02 / std::sqrt(2.0 * m.n_layers)).epsilon(0.1));
    CHECK(a[t.get("ln_f.weight").offset] == 1.0f);
    CHECK(a[t.get("h.0.mlp.c_fc.bias").offset] == 0.0f);
    const ParamSpec& wte = t.get("wte");
    for (int64_t r = m.vocab_size; r < m.padded_vocab; r++)
      for (int c2 = 0; c2 < m.d_model; c2++) REQUIRE(a[wte.offset + r * m.d_model + c2] == 0.0f);
  }

  SECTION("a parameter's values do not depend on the other parameters") {
    ModelSection deeper = m;
    deeper.n_layers = 3;
    const ParamTable t3 = build_param_table(deeper);
    std::vector<float> d(t3.total_numel());
    init_params(t3, 42, d.data());
    const ParamSpec& p2 = t.get("h.1.attn.c_attn.weight");
    const ParamSpec& p3 = t3.get("h.1.attn.c_attn.weight");
    CHECK(std::equal(a.begin() + p2.offset, a.begin() + p2.offset + p2.numel, d.begin() + p3.offset));
  }
}

TEST_CASE("the initial loss is about ln(vocab) and padded logits get no gradient", "[model]") {
  const ModelSection m = small_model();
  CpuModel model(m, 1);
  const ParamTable& t = model.table;
  const int B = 2, T = 16;
  DecoderStage stage(m, model.store, model.ops, B, T);
  std::mt19937 rng(3);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; i++) tok[i] = rng() % m.vocab_size, tgt[i] = rng() % m.vocab_size;
  const double loss = stage.forward(tok.data(), tgt.data(), 1.0f / (B * T)) / (B * T);
  CHECK(loss == Approx(std::log(double(m.vocab_size))).epsilon(0.05));
  stage.backward();
  const ParamSpec& wte = t.get("wte");
  const float* g = model.store.grad(wte).f32();
  for (int64_t r = m.vocab_size; r < m.padded_vocab; r++)
    for (int c = 0; c < m.d_model; c++) REQUIRE(g[r * m.d_model + c] == 0.0f);
}

TEST_CASE("the tiny model overfits one fixed batch", "[model][train]") {
  ModelSection m = small_model();
  m.n_layers = 2;
  CpuModel model(m, 7);
  CpuOps& ops = model.ops;
  ParamStore& store = model.store;
  const int B = 4, T = 32, N = B * T;
  DecoderStage stage(m, store, ops, B, T);
  std::mt19937 rng(11);
  std::vector<int32_t> seq(N + 1);
  for (auto& s : seq) s = rng() % m.vocab_size;
  std::vector<int32_t> tok(seq.begin(), seq.end() - 1), tgt(seq.begin() + 1, seq.end());

  OptimSection o;
  o.lr = 3e-3;
  o.weight_decay = 0.0;
  double first = 0, last = 0;
  int steps = 0;
  const int max_steps = 400;
  for (; steps < max_steps; steps++) {
    ops.zero(store.all_grads());
    last = stage.forward(tok.data(), tgt.data(), 1.0f / N) / N;
    if (steps == 0) first = last;
    if (last < 0.1 * first) break;
    stage.backward();
    adamw_step(ops, store, o, o.lr, steps + 1);
  }
  INFO("start " << first << ", after " << steps << " steps " << last);
  CHECK(first > 3.5);
  CHECK(last < 0.1 * first);
}

// One forward + backward of a fresh model: the loss and every parameter gradient.
static std::pair<double, std::vector<float>> loss_and_grads(const ModelSection& m, int B, int T) {
  CpuModel model(m, 5);
  DecoderStage stage(m, model.store, model.ops, B, T);
  std::mt19937 rng(9);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; i++) tok[i] = rng() % m.vocab_size, tgt[i] = rng() % m.vocab_size;
  tgt[7] = -1;  // an ignored target inside a chunk
  const double loss = stage.forward(tok.data(), tgt.data(), 1.0f / (B * T));
  stage.backward();
  const Tensor g = model.store.all_grads();
  std::vector<float> grads(g.numel);
  model.ops.download(grads.data(), DType::f32, g, g.numel);
  return {loss, grads};
}

TEST_CASE("the LM head in chunks of rows gives the whole head's loss and gradients", "[model]") {
  // 5 x 32 = 160 rows of 64 fp32 logits (256 bytes): a 16 KB budget is 64-row chunks, so the
  // head runs 64 + 64 + 32 rows; the tied (GPT-2) and the untied (Llama) head.
  ModelSection llama = small_model();
  llama.arch = "llama", llama.n_kv_heads = 1, llama.ffn_hidden = 40, llama.tie_embeddings = false;
  for (const ModelSection& m : {small_model(), llama}) {
    INFO("arch " << m.arch);
    const int B = 5, T = 32;
    CHECK(head_chunk_rows(B * T, m.padded_vocab, DType::f32) == B * T);
    const auto whole = loss_and_grads(m, B, T);
    set_head_chunk_bytes_for_tests(64 * 64 * sizeof(float));
    CHECK(head_chunk_rows(B * T, m.padded_vocab, DType::f32) == 64);
    const auto chunked = loss_and_grads(m, B, T);
    set_head_chunk_bytes_for_tests(0);
    CHECK(chunked.first == Approx(whole.first).epsilon(1e-6));
    double diff = 0, norm = 0;
    for (size_t i = 0; i < whole.second.size(); i++) {
      diff += std::pow(double(chunked.second[i]) - whole.second[i], 2);
      norm += std::pow(double(whole.second[i]), 2);
    }
    CHECK(norm > 0);
    CHECK(std::sqrt(diff / norm) < 1e-6);  // only the head's dW accumulates in another order
  }
}
