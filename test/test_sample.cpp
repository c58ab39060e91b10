// Sampling, in process on the CPU backend: the KV-cache decoder's logits equal a full forward's
// (DecoderStage, no cache) at every step, for any prompt chunking and past max_seq_len, for
// GPT-2 and for Llama (RoPE at the cached positions, grouped-query attention's shared K/V heads,
// SwiGLU, RMSNorm, an untied head); token choice (greedy, top-k, temperature, the seeded
// stream); generation is reproducible and greedy is the argmax of the full forward step by step;
// incremental UTF-8.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/common/counter_rng.h"
#include "core/cpu/cpu_ops.h"
#include "core/model/kv_cache_decoder.h"
#include "core/model/decoder_stage.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/model/sampler.h"
#include "cpu_test_support.h"

using namespace pt;
using pt::test::random_tokens;
using pt::test::require_close;

namespace {

ModelSection small_model() {
  ModelSection m;
  m.n_layers = 2;
  m.d_model = 48;
  m.n_heads = 3;
  m.vocab_size = 61;
  m.pad_vocab_multiple = 16;
  m.padded_vocab = 64;
  m.max_seq_len = 24;
  return m;
}

// The same shape as Llama: three query heads sharing one K/V head, a SwiGLU of width 40, an
// untied head, a RoPE base small enough that the angles turn over the 24 positions.
ModelSection small_llama() {
  ModelSection m = small_model();
  m.arch = "llama";
  m.n_kv_heads = 1;
  m.ffn_hidden = 40;
  m.rope_theta = 100.0;
  m.tie_embeddings = false;
  return m;
}

// The Llama with experts: block 1 sparse (4 SwiGLU experts of width 16, top-2, one shared
// expert), block 0 dense, so both MLP paths and the routing run.
ModelSection small_moe() {
  ModelSection m = small_llama();
  m.moe.n_experts = 4;
  m.moe.top_k = 2;
  m.moe.expert_hidden = 16;
  m.moe.every = 2;
  m.moe.n_shared_experts = 1;
  return m;
}

// Each test runs for every architecture (and the Llama with experts).
#define FOR_EACH_ARCH(m)                                                                   \
  const ModelSection m = GENERATE(small_model(), small_llama(), small_moe());              \
  CAPTURE(m.arch, m.moe.n_experts)

// Random weights everywhere (biases and norm parameters too, so a wrong slice of the fused
// qkv bias shows), padded vocabulary rows zero as in a real model (the token embedding's, and
// an untied head's).
std::vector<float> random_weights(const ParamTable& table, const ModelSection& m, uint64_t seed) {
  std::vector<float> w(table.total_numel());
  for (size_t i = 0; i < w.size(); i++) w[i] = static_cast<float>(0.15 * counter_normal(seed, 1, i));
  for (const ParamSpec& p : table.specs())
    if (p.role == ParamRole::token_embedding || p.role == ParamRole::head)
      std::fill(w.begin() + p.offset + size_t(m.vocab_size) * m.d_model, w.begin() + p.offset + p.numel, 0.0f);
  return w;
}

// A one-rank model on the CPU and its full, cache-free forward.
struct Model {
  CpuOps ops;
  ModelSection m;
  ParamTable table;
  ParamStore store;
  std::vector<float> weights;
  explicit Model(const ModelSection& model, uint64_t seed = 5)
      : m(model), table(build_param_table(model)), store(table, ops), weights(random_weights(table, model, seed)) {
    store.load_master(weights.data());
  }
  // Logits [T, vocab_size] of every position of `tokens` (T <= max_seq_len) in one forward.
  std::vector<std::vector<float>> full_forward(const std::vector<int32_t>& tokens) {
    const int T = static_cast<int>(tokens.size());
    DecoderStage stage(m, store, ops, 1, T);
    const std::vector<int32_t> no_targets(T, -1);
    stage.forward(tokens.data(), no_targets.data(), 0.0f);
    std::vector<float> all(size_t(T) * m.padded_vocab);
    ops.download(all.data(), DType::f32, stage.logits(), all.size());
    std::vector<std::vector<float>> rows(T);
    for (int t = 0; t < T; t++)
      rows[t].assign(all.begin() + size_t(t) * m.padded_vocab, all.begin() + size_t(t) * m.padded_vocab + m.vocab_size);
    return rows;
  }
};

// Within 1e-5 relative, measured against the row's largest logit (a logit near 0 has no
// relative scale of its own).
void require_logits_close(std::span<const float> got, const std::vector<float>& want, const std::string& what) {
  float scale = 0;
  for (float x : want) scale = std::max(scale, std::fabs(x));
  require_close(std::vector<float>(got.begin(), got.end()), want, 1e-5 * scale, 1e-5, what);
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

TEST_CASE("KV-cache decoding gives the full forward's logits at every step", "[sample]") {
  FOR_EACH_ARCH(m);
  Model model(m);
  const int T = model.m.max_seq_len;
  const std::vector<int32_t> tokens = random_tokens(T, model.m.vocab_size, 3);
  const auto full = model.full_forward(tokens);

  for (int prompt : {1, 5, T}) {
    DYNAMIC_SECTION("a prompt of " << prompt << " tokens, then one token at a time") {
      KvCacheDecoder dec(model.m, model.store, model.ops);
      auto logits = dec.prime(std::span(tokens).first(prompt));
      require_logits_close(logits, full[prompt - 1], "after the prompt");
      for (int t = prompt; t < T; t++) {
        logits = dec.push(tokens[t]);
        REQUIRE(dec.length() == t + 1);
        require_logits_close(logits, full[t], "position " + std::to_string(t));
      }
    }
  }
  SECTION("weights uploaded from the host equal the ParamStore's") {
    KvCacheDecoder a(model.m, model.store, model.ops), b(model.m, model.weights.data(), model.ops);
    const auto sa = a.prime(tokens), lb = b.prime(tokens);
    CHECK(pt::test::bitwise_equal(std::vector<float>(sa.begin(), sa.end()), std::vector<float>(lb.begin(), lb.end())));
    require_logits_close(lb, full[T - 1], "uploaded weights");
  }
  SECTION("an id outside the vocabulary is refused and changes nothing") {
    KvCacheDecoder dec(model.m, model.store, model.ops);
    dec.prime(std::span(tokens).first(4));
    CHECK_THROWS_WITH(dec.push(model.m.vocab_size), Catch::Matchers::Contains("outside the model's vocabulary"));
    CHECK(dec.length() == 4);
    require_logits_close(dec.push(tokens[4]), full[4], "after the refused id");
  }
  SECTION("priming again starts over") {
    KvCacheDecoder dec(model.m, model.store, model.ops);
    dec.prime(random_tokens(7, model.m.vocab_size, 9));
    dec.push(4);
    require_logits_close(dec.prime(std::span(tokens).first(3)), full[2], "second prime");
    CHECK(dec.length() == 3);
  }
}

TEST_CASE("past max_seq_len the decoder sees the last max_seq_len tokens", "[sample]") {
  FOR_EACH_ARCH(m);
  Model model(m);
  const int T = model.m.max_seq_len, extra = 6;
  const std::vector<int32_t> tokens = random_tokens(T + extra, model.m.vocab_size, 4);
  auto window_logits = [&](int last) {  // the full forward over tokens (last - T, last]
    return model.full_forward(std::vector<int32_t>(tokens.begin() + last - T + 1, tokens.begin() + last + 1)).back();
  };
  SECTION("one token at a time") {
    KvCacheDecoder dec(model.m, model.store, model.ops);
    dec.prime(std::span(tokens).first(T));
    for (int t = T; t < T + extra; t++) {
      auto logits = dec.push(tokens[t]);
      CHECK(dec.length() == T);
      require_logits_close(logits, window_logits(t), "position " + std::to_string(t));
    }
  }
  SECTION("a prompt longer than max_seq_len keeps its end") {
    KvCacheDecoder dec(model.m, model.store, model.ops);
    require_logits_close(dec.prime(tokens), window_logits(T + extra - 1), "long prompt");
    CHECK(dec.length() == T);
  }
}

TEST_CASE("choose_token: greedy, top-k and temperature", "[sample]") {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  SECTION("temperature 0 is the argmax, the lowest id among ties") {
    for (double u : {0.0, 0.3, 0.999}) CHECK(choose_token(logits, 0.0, 0, u) == 1);
    CHECK(choose_token(logits, 0.0, 3, 0.5) == 1);
  }
  SECTION("top-k 1 is the argmax at any temperature") {
    for (double u : {0.0, 0.3, 0.999}) CHECK(choose_token(logits, 1.5, 1, u) == 1);
  }
  SECTION("the cumulative distribution, in id order") {
    // logits 0 and log 3 at temperature 1: probabilities 1/4 and 3/4.
    const std::vector<float> two = {0.0f, static_cast<float>(std::log(3.0))};
    CHECK(choose_token(two, 1.0, 0, 0.2) == 0);
    CHECK(choose_token(two, 1.0, 0, 0.3) == 1);
    CHECK(choose_token(two, 1.0, 0, 0.99) == 1);
    // Temperature 2 halves the logits: probabilities 1/(1+sqrt 3) and sqrt 3/(1+sqrt 3) = 0.366, 0.634.
    CHECK(choose_token(two, 2.0, 0, 0.36) == 0);
    CHECK(choose_token(two, 2.0, 0, 0.37) == 1);
  }
  SECTION("top-k keeps only the k largest (ties at the cut to the lower id)") {
    // top-2 of {0.5, 2, -1, 2, 1} is ids 1 and 3, equally likely.
    CHECK(choose_token(logits, 1.0, 2, 0.49) == 1);
    CHECK(choose_token(logits, 1.0, 2, 0.51) == 3);
    for (int i = 0; i < 200; i++) {
      const int32_t id = choose_token(logits, 1.0, 3, sample_uniform(1, i));
      CHECK((id == 1 || id == 3 || id == 4));
    }
  }
  SECTION("frequencies follow the softmax") {
    const std::vector<float> three = {0.0f, 1.0f, 2.0f};
    std::vector<int> count(3);
    const int n = 20000;
    for (int i = 0; i < n; i++) count[choose_token(three, 1.0, 0, sample_uniform(42, i))]++;
    const double z = 1 + std::exp(1.0) + std::exp(2.0);
    CHECK(count[0] / double(n) == Approx(1 / z).margin(0.01));
    CHECK(count[1] / double(n) == Approx(std::exp(1.0) / z).margin(0.01));
    CHECK(count[2] / double(n) == Approx(std::exp(2.0) / z).margin(0.01));
  }
}

TEST_CASE("generation: reproducible, greedy is the full forward's argmax", "[sample]") {
  FOR_EACH_ARCH(m);
  Model model(m);
  const std::vector<int32_t> prompt = random_tokens(4, model.m.vocab_size, 8);
  const int n = model.m.max_seq_len - 4;  // the whole sequence fits one full forward
  auto run = [&](double temperature, int top_k, uint64_t seed) {
    KvCacheDecoder dec(model.m, model.store, model.ops);
    SampleOptions o;
    o.max_new_tokens = n;
    o.temperature = temperature;
    o.top_k = top_k;
    o.seed = seed;
    std::vector<int32_t> seen;
    auto out = generate(dec, prompt, o, model.m.vocab_size, [&](int32_t id) { seen.push_back(id); });
    CHECK(seen == out);
    return out;
  };

  SECTION("temperature 0: each token is the argmax of the full forward over everything before it") {
    const auto out = run(0.0, 0, 1);
    REQUIRE(out.size() == size_t(n));
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), out.begin(), out.end() - 1);
    const auto full = model.full_forward(seq);
    for (int i = 0; i < n; i++) CHECK(out[i] == argmax(full[prompt.size() - 1 + i]));
    CHECK(run(0.0, 0, 99) == out);  // the seed plays no part
  }
  SECTION("top-k 1 is greedy") { CHECK(run(1.0, 1, 7) == run(0.0, 0, 7)); }
  SECTION("the same seed gives the same tokens, another seed others") {
    const auto a = run(1.0, 0, 11);
    CHECK(run(1.0, 0, 11) == a);
    CHECK(run(1.0, 0, 12) != a);
    CHECK(run(1.0, 5, 11) == run(1.0, 5, 11));
  }
  SECTION("the stop token ends the sample, and is in it") {
    const auto greedy = run(0.0, 0, 1);
    KvCacheDecoder dec(model.m, model.store, model.ops);
    SampleOptions o;
    o.max_new_tokens = n;
    o.temperature = 0;
    o.stop_token = greedy[2];
    const auto stopped = generate(dec, prompt, o, model.m.vocab_size);
    const size_t first = std::find(greedy.begin(), greedy.end(), greedy[2]) - greedy.begin();
    CHECK(stopped == std::vector<int32_t>(greedy.begin(), greedy.begin() + first + 1));
  }
  SECTION("only the first `vocab` ids are candidates") {
    KvCacheDecoder dec(model.m, model.store, model.ops);
    SampleOptions o;
    o.max_new_tokens = 30;
    o.temperature = 3.0;
    o.top_k = 0;
    for (int32_t id : generate(dec, prompt, o, 10)) CHECK(id < 10);
  }
  SECTION("more tokens than max_seq_len") {
    KvCacheDecoder dec(model.m, model.store, model.ops);
    SampleOptions o;
    o.max_new_tokens = 3 * model.m.max_seq_len;
    CHECK(generate(dec, prompt, o, model.m.vocab_size).size() == size_t(o.max_new_tokens));
    CHECK(dec.length() == model.m.max_seq_len);
  }
}

TEST_CASE("Utf8Stream holds back only an unfinished character", "[sample]") {
  Utf8Stream s;
  SECTION("ASCII passes at once") { CHECK(s.push("abc") == "abc"); }
  SECTION("a 2-byte and a 4-byte character split across pushes") {
    CHECK(s.push("a\xC3") == "a");
    CHECK(s.push("\xA9z") == "\xC3\xA9z");
    CHECK(s.push("\xF0\x9F") == "");
    CHECK(s.push("\x98") == "");
    CHECK(s.push("\x80!") == "\xF0\x9F\x98\x80!");
    CHECK(s.flush().empty());
  }
  SECTION("bytes that can never complete pass through unchanged") {
    CHECK(s.push("\xFF") == "\xFF");
    CHECK(s.push("\x80") == "\x80");  // a lone continuation byte
    CHECK(s.push("\xE2\x82") == "");
    CHECK(s.push("x") == "\xE2\x82x");  // the character was cut short
    CHECK(s.push("\xC0") == "\xC0");    // never a lead byte in UTF-8
  }
  SECTION("flush returns what is pending") {
    CHECK(s.push("ok\xE2\x82") == "ok");
    CHECK(s.flush() == "\xE2\x82");
    CHECK(s.flush().empty());
  }
}

TEST_CASE("tokenizer by vocabulary size", "[sample]") {
  CHECK(tokenizer_for_vocab(256) == "bytes");
  CHECK(tokenizer_for_vocab(50257) == "gpt2");
  CHECK(tokenizer_for_vocab(50304).empty());
  CHECK(tokenizer_for_vocab(61).empty());
}
