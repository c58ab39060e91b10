// Hugging Face folders of Llama (LlamaForCausalLM): a grouped-query model with an untied head
// and one with a tied head export to model.safetensors under Hugging Face's own names, [out, in]
// (no transposes), the padded vocabulary rows left out, checked byte for byte by hand; config.json
// holds every field LlamaConfig reads; the folder imports back bit for bit; a config.json that
// describes a Llama picotrain does not compute exactly is refused naming the key, and a head
// that is absent, present or different is checked against tie_word_embeddings.
#include <catch2/catch.hpp>
#include <cstring>

#include "ckpt_test_support.h"
#include "core/ckpt/hf_model_folder.h"
#include "core/ckpt/llmc_model_file.h"
#include "core/ckpt/manifest.h"
#include "core/cpu/cpu_ops.h"
#include "hf_test_support.h"

using namespace pt;
using namespace pt::test;
using namespace pt::ckpt;
using Catch::Matchers::Contains;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// 2 layers, d_model 32, 4 query heads over 2 key/value heads (head_dim 8), MLP width 48,
// vocabulary 200 padded to 256; eps and theta not the defaults, so the config shows they travel.
const std::vector<std::string> kLlama = {"model.arch=llama",    "model.n_heads=4",      "model.n_kv_heads=2",
                                         "model.ffn_hidden=48", "model.norm_eps=1e-6", "model.rope_theta=500000"};

std::vector<std::string> with(std::vector<std::string> sets, const std::string& more) {
  sets.push_back(more);
  return sets;
}

// Hugging Face's LlamaForCausalLM state dict for this model, in picotrain's table order, with
// the shapes transformers gives its modules (nn.Embedding [vocab, C], nn.Linear [out, in],
// LlamaRMSNorm [C]), written out here from Hugging Face's definitions.
std::vector<std::pair<std::string, std::vector<int64_t>>> hf_state_dict(int layers, int64_t vocab, int64_t C,
                                                                       int64_t q, int64_t kv, int64_t F, bool tied) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> s = {{"model.embed_tokens.weight", {vocab, C}}};
  for (int l = 0; l < layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s.push_back({p + "input_layernorm.weight", {C}});
    s.push_back({p + "self_attn.q_proj.weight", {q, C}});
    s.push_back({p + "self_attn.k_proj.weight", {kv, C}});
    s.push_back({p + "self_attn.v_proj.weight", {kv, C}});
    s.push_back({p + "self_attn.o_proj.weight", {C, q}});
    s.push_back({p + "post_attention_layernorm.weight", {C}});
    s.push_back({p + "mlp.gate_proj.weight", {F, C}});
    s.push_back({p + "mlp.up_proj.weight", {F, C}});
    s.push_back({p + "mlp.down_proj.weight", {C, F}});
  }
  s.push_back({"model.norm.weight", {C}});
  if (!tied) s.push_back({"lm_head.weight", {vocab, C}});
  return s;
}

}  // namespace

TEST_CASE("Llama Hugging Face folder: GQA, untied head; the bytes by hand, config.json, import bit for bit",
          "[ckpt][hf][llama]") {
  CkptFixture fx("hf_llama", 200);
  const RunConfig cfg = fx.config(kLlama);
  const ModelSection& m = cfg.model;
  REQUIRE(m.padded_vocab == 256);
  REQUIRE(m.kv_heads() == 2);
  REQUIRE_FALSE(m.tied());
  const ParamTable table = build_param_table(m);
  const std::vector<float> w = random_weights(table);
  const std::string ckpt = write_weights_checkpoint(fx, m, w, "ckpt");
  const std::string hf = (fx.dir / "hf").string();
  CHECK(export_hf(ckpt, hf, HfDtype::f32) == ckpt + "/step_00000000");
  CHECK(is_hf_model_folder(hf));

  SECTION("model.safetensors: Hugging Face's names and shapes in table order, raw [out, in] data") {
    const auto want = hf_state_dict(2, 200, 32, 4 * 8, 2 * 8, 48, false);
    // picotrain's names are Hugging Face's: the table lists exactly the state dict.
    REQUIRE(table.specs().size() == want.size());
    for (size_t i = 0; i < want.size(); i++) CHECK(table.specs()[i].name == want[i].first);

    const std::vector<char> bytes = file_bytes(hf + "/model.safetensors");
    REQUIRE(bytes.size() >= 8);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    REQUIRE(8 + n <= bytes.size());
    CHECK((8 + n) % 8 == 0);
    const ojson h = ojson::parse(std::string(bytes.data() + 8, n));
    CHECK(h["__metadata__"] == ojson{{"format", "pt"}});
    REQUIRE(h.size() == want.size() + 1);
    const char* data = bytes.data() + 8 + n;
    uint64_t at = 0;
    size_t i = 0;
    for (const auto& [name, e] : h.items()) {
      if (name == "__metadata__") continue;
      INFO(name);
      REQUIRE(i < want.size());
      CHECK(name == want[i].first);
      CHECK(e["dtype"] == "F32");
      CHECK(e["shape"].get<std::vector<int64_t>>() == want[i].second);
      // The first rows of picotrain's tensor as they are: no transpose, padding rows dropped.
      const ParamSpec& p = table.specs()[i++];
      size_t numel = 1;
      for (int64_t d : want[i - 1].second) numel *= static_cast<size_t>(d);
      CHECK(e["data_offsets"] == ojson{at, at + numel * 4});
      CHECK(std::memcmp(data + at, w.data() + p.offset, numel * 4) == 0);
      at += numel * 4;
    }
    CHECK(8 + n + at == bytes.size());
  }

  SECTION("config.json: every field LlamaConfig reads") {
    const json c = json::parse(read_text(hf + "/config.json"));
    CHECK(c["architectures"] == json{"LlamaForCausalLM"});
    CHECK(c["model_type"] == "llama");
    CHECK(c["vocab_size"] == 200);
    CHECK(c["hidden_size"] == 32);
    CHECK(c["intermediate_size"] == 48);
    CHECK(c["num_hidden_layers"] == 2);
    CHECK(c["num_attention_heads"] == 4);
    CHECK(c["num_key_value_heads"] == 2);
    CHECK(c["head_dim"] == 8);
    CHECK(c["hidden_act"] == "silu");
    CHECK(c["max_position_embeddings"] == 64);
    CHECK(c["rms_norm_eps"] == 1e-6);
    CHECK(c["rope_theta"] == 500000.0);
    CHECK(c["rope_scaling"].is_null());
    CHECK(c["attention_bias"] == false);
    CHECK(c["mlp_bias"] == false);
    CHECK(c["tie_word_embeddings"] == false);
    CHECK(c["torch_dtype"] == "float32");
    CHECK(c["initializer_range"] == 0.02);
    CHECK(c["attention_dropout"] == 0.0);
    CHECK(c["pretraining_tp"] == 1);
    CHECK(c["bos_token_id"].is_null());  // no <|endoftext|> in a 200-token vocabulary
    CHECK(c["eos_token_id"].is_null());
  }

  SECTION("import gives back the model and the weights, bit for bit") {
    const std::string imported = (fx.dir / "imported").string();
    CHECK(import_hf(hf, imported) == imported + "/step_00000000");
    CHECK(same_bytes(checkpoint_weights(imported, table), w));
    CheckpointReader r(resolve_checkpoint_path(imported, "test"));
    CHECK(r.manifest().model == model_shape_json(m));
    const ModelSection back = model_from_manifest(r.manifest(), imported);
    CHECK(back.arch == "llama");
    CHECK(back.kv_heads() == 2);
    CHECK(back.ffn_width() == 48);
    CHECK(back.eps() == 1e-6);
    CHECK(back.rope_base() == 500000.0);
    CHECK_FALSE(back.tied());
    CHECK(back.padded_vocab == 256);
  }

  SECTION("bf16: BF16 tensors rounded to nearest even, and back") {
    const std::string hf16 = (fx.dir / "hf16").string();
    export_hf(ckpt, hf16, HfDtype::bf16);
    CHECK(json::parse(read_text(hf16 + "/config.json"))["torch_dtype"] == "bfloat16");
    const SafetensorsFile f(hf16 + "/model.safetensors");
    for (const StTensor& t : f.tensors()) CHECK(t.dtype == "BF16");
    const std::string imported = (fx.dir / "imported16").string();
    import_hf(hf16, imported);
    const std::vector<float> back = checkpoint_weights(imported, table);
    int wrong = 0;
    for (size_t i = 0; i < w.size(); i++) wrong += back[i] != bf16_to_f32(f32_to_bf16(w[i]));
    CHECK(wrong == 0);
  }

  SECTION("folders saved otherwise: LlamaModel's bare names, the old inv_freq buffers, default rope types") {
    const std::string other = (fx.dir / "other").string();
    rewrite_folder(
        hf, other,
        [](std::vector<LoadedTensor>& ts) {
          for (auto& t : ts)
            if (t.name.rfind("model.", 0) == 0) t.name = t.name.substr(6);
          ts.push_back({"layers.0.self_attn.rotary_emb.inv_freq", {4}, {1, 0.5f, 0.25f, 0.125f}});
        },
        [](json& c) { c["rope_scaling"] = {{"rope_type", "default"}}; });
    const std::string imported = (fx.dir / "imported_other").string();
    import_hf(other, imported);
    CHECK(same_bytes(checkpoint_weights(imported, table), w));

    // transformers 5 keeps theta in rope_parameters.
    rewrite_folder(
        hf, other, [](auto&) {},
        [](json& c) {
          c.erase("rope_theta");
          c.erase("rope_scaling");
          c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
        });
    const std::string imported2 = (fx.dir / "imported_rope_parameters").string();
    import_hf(other, imported2);
    CHECK(model_from_manifest(CheckpointReader(resolve_checkpoint_path(imported2, "t")).manifest(), imported2)
              .rope_base() == 1e6);
  }

  SECTION("import refuses a config.json picotrain does not compute exactly, naming the key") {
    const std::string bad = (fx.dir / "badcfg").string(), out = (fx.dir / "never").string();
    auto refused = [&](const std::function<void(json&)>& edit) {
      rewrite_folder(
          hf, bad, [](auto&) {}, edit);
      return import_error(bad, out);
    };
    CHECK_THAT(refused([](json& c) { c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; }),
               Contains("\"rope_scaling\": {\"factor\":8.0,\"rope_type\":\"llama3\"} is not supported"));
    CHECK_THAT(refused([](json& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; }),
               Contains("\"rope_scaling\""));
    CHECK_THAT(refused([](json& c) { c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}}; }),
               Contains("\"rope_parameters\""));
    CHECK_THAT(refused([](json& c) { c["attention_bias"] = true; }),
               Contains("\"attention_bias\": true is not supported"));
    CHECK_THAT(refused([](json& c) { c["mlp_bias"] = true; }), Contains("\"mlp_bias\": true is not supported"));
    CHECK_THAT(refused([](json& c) { c["hidden_act"] = "gelu"; }),
               Contains("\"hidden_act\": \"gelu\" is not supported"));
    CHECK_THAT(refused([](json& c) { c["head_dim"] = 16; }),
               Contains("\"head_dim\": 16 is not supported: picotrain's head_dim is hidden_size / "
                        "num_attention_heads = 8"));
    CHECK_THAT(refused([](json& c) { c["pretraining_tp"] = 2; }), Contains("\"pretraining_tp\": 2 is not supported"));
    CHECK_THAT(refused([](json& c) { c["num_key_value_heads"] = 3; }),
               Contains("\"num_key_value_heads\": 3 does not divide num_attention_heads=4"));
    CHECK_THAT(refused([](json& c) { c["num_attention_heads"] = 3; }),
               Contains("\"num_attention_heads\": 3 does not divide hidden_size=32"));
    CHECK_THAT(refused([](json& c) { c["rms_norm_eps"] = 0; }), Contains("\"rms_norm_eps\": 0 is not a number > 0"));
    CHECK_THAT(refused([](json& c) { c["intermediate_size"] = "48"; }),
               Contains("\"intermediate_size\": \"48\" is not a whole number"));
    // The shapes the config implies are checked against the file's.
    CHECK_THAT(refused([](json& c) { c["num_key_value_heads"] = 4; }),
               Contains("tensor model.layers.0.self_attn.k_proj.weight has shape [16, 32], expected [32, 32]"));
    CHECK_THAT(refused([](json& c) { c["intermediate_size"] = 64; }),
               Contains("tensor model.layers.0.mlp.gate_proj.weight has shape [48, 32], expected [64, 32]"));
    // Left out, tie_word_embeddings is LlamaConfig's false: this file has the head it needs.
    CHECK(refused([](json& c) { c.erase("tie_word_embeddings"); }) == "(accepted)");
    // Tied, the head must be the embedding (it is not here).
    CHECK_THAT(refused([](json& c) { c["tie_word_embeddings"] = true; }),
               Contains("lm_head.weight differs from model.embed_tokens.weight"));
    CHECK_FALSE(fs::exists(out));
  }

  SECTION("import refuses tensors that are not the model's, naming the tensor") {
    const std::string bad = (fx.dir / "bad").string(), out = (fx.dir / "never").string();
    rewrite_folder(hf, bad, [](auto& ts) { std::erase_if(ts, [](auto& t) { return t.name == "lm_head.weight"; }); });
    CHECK_THAT(import_error(bad, out),
               Contains("has no tensor lm_head.weight, which the LlamaForCausalLM of " + bad +
                        "/config.json needs (its tie_word_embeddings is false"));
    // A projection stored [in, out], as someone who transposed it like GPT-2's Conv1D would.
    rewrite_folder(hf, bad,
                   [](auto& ts) { tensor_named(ts, "model.layers.1.mlp.down_proj.weight")->shape = {48, 32}; });
    CHECK_THAT(import_error(bad, out),
               Contains("tensor model.layers.1.mlp.down_proj.weight has shape [48, 32], expected [32, 48]"));
    rewrite_folder(hf, bad, [](auto& ts) {
      ts.push_back({"model.layers.0.self_attn.q_proj.bias", {32}, std::vector<float>(32)});
    });
    CHECK_THAT(import_error(bad, out), Contains("model.layers.0.self_attn.q_proj.bias is not a parameter"));
    CHECK_FALSE(fs::exists(out));
  }
}

TEST_CASE("Llama Hugging Face folder: a trained model out and back in, and a run resumes from it",
          "[ckpt][hf][llama]") {
  CkptFixture fx("hf_llama_trained", 200);
  const std::vector<std::string> sets = kLlama;
  std::vector<float> trained;
  {
    CpuOps ops;
    const World world;
    Trainer t(fx.config(sets), world, ops);
    for (int i = 0; i < 2; i++) t.step();
    t.save_checkpoint();
    trained = master_weights(t);
  }
  const std::string hf = (fx.dir / "hf").string(), imported = (fx.dir / "imported").string();
  CHECK(export_hf(fx.ckpt_dir(), hf, HfDtype::f32) == fx.step_dir(2));
  import_hf(hf, imported);
  const ParamTable table = build_param_table(fx.config(sets).model);
  CHECK(same_bytes(checkpoint_weights(imported, table), trained));

  CpuOps ops;
  const World world;
  Trainer t(fx.config(with(with(sets, "checkpoint.resume=" + imported), "checkpoint.dir=" + (fx.dir / "ft").string())),
            world, ops);
  CHECK(t.steps_done() == 0);
  CHECK(same_bytes(master_weights(t), trained));
}

TEST_CASE("Llama Hugging Face folder: a tied head is no tensor, and reads back tied", "[ckpt][hf][llama]") {
  CkptFixture fx("hf_llama_tied", 200);
  const RunConfig cfg = fx.config(with(kLlama, "model.tie_embeddings=true"));
  const ModelSection& m = cfg.model;
  REQUIRE(m.tied());
  const ParamTable table = build_param_table(m);
  CHECK_THROWS(table.get("lm_head.weight"));
  const std::vector<float> w = random_weights(table);
  const std::string ckpt = write_weights_checkpoint(fx, m, w, "ckpt");
  const std::string hf = (fx.dir / "hf").string();
  export_hf(ckpt, hf, HfDtype::f32);

  const SafetensorsFile f(hf + "/model.safetensors");
  const auto want = hf_state_dict(2, 200, 32, 32, 16, 48, true);
  REQUIRE(f.tensors().size() == want.size());
  for (size_t i = 0; i < want.size(); i++) {
    CHECK(f.tensors()[i].name == want[i].first);
    CHECK(f.tensors()[i].shape == want[i].second);
  }
  CHECK(f.find("lm_head.weight") == nullptr);
  CHECK(json::parse(read_text(hf + "/config.json"))["tie_word_embeddings"] == true);

  const std::string imported = (fx.dir / "imported").string();
  import_hf(hf, imported);
  CHECK(same_bytes(checkpoint_weights(imported, table), w));
  CHECK(model_from_manifest(CheckpointReader(resolve_checkpoint_path(imported, "t")).manifest(), imported).tied());

  // An older save that kept the tied head: accepted when it is the embedding.
  const std::string old = (fx.dir / "old").string();
  rewrite_folder(hf, old, [](std::vector<LoadedTensor>& ts) {
    LoadedTensor head = *tensor_named(ts, "model.embed_tokens.weight");
    head.name = "lm_head.weight";
    ts.push_back(head);
  });
  const std::string imported_old = (fx.dir / "imported_old").string();
  CHECK(import_error(old, imported_old) == "(accepted)");

  // Without a head tensor the config must say tied: LlamaConfig's default (false) needs one.
  const std::string untied = (fx.dir / "untied").string();
  rewrite_folder(
      hf, untied, [](auto&) {}, [](json& c) { c.erase("tie_word_embeddings"); });
  CHECK_THAT(import_error(untied, (fx.dir / "never").string()),
             Contains("has no tensor lm_head.weight, which the LlamaForCausalLM of " + untied +
                      "/config.json needs (its tie_word_embeddings is false"));
}

TEST_CASE("Llama Hugging Face table: every parameter has its rule, an untied head is optional", "[ckpt][hf][llama]") {
  ModelSection m;
  m.arch = "llama";
  m.n_layers = 3;
  m.d_model = 64;
  m.n_heads = 8;
  m.n_kv_heads = 2;
  m.vocab_size = 50257;
  m.padded_vocab = 50304;
  m.max_seq_len = 128;
  for (const bool tied : {false, true}) {
    m.tie_embeddings = tied;
    const ParamTable table = build_param_table(m);
    const std::vector<HfTensor> ts = hf_tensors(hf_llama(), table, m);
    REQUIRE(ts.size() == table.specs().size());
    for (const HfTensor& t : ts) {
      CHECK(t.name == t.param->name);
      CHECK_FALSE(t.transpose);
      CHECK(t.vocab_rows == (t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight"));
    }
    CHECK(ts.front().shape == std::vector<int64_t>{50257, 64});
    CHECK(ts.back().name == (tied ? "model.norm.weight" : "lm_head.weight"));
    // GPT-2's tokenizer: <|endoftext|> begins and ends documents.
    const ojson c = hf_llama().config_json(m, HfDtype::bf16);
    CHECK(c["bos_token_id"] == 50256);
    CHECK(c["eos_token_id"] == 50256);
    CHECK(c["intermediate_size"] == 256);  // Llama's rule: 8/3 * 64 = 170 rounded up to 256
    CHECK(c["torch_dtype"] == "bfloat16");
  }
  CHECK(&hf_architecture_for_model(m) == &hf_llama());
  CHECK(&hf_architecture_for_model_type("llama", "x") == &hf_llama());
}
