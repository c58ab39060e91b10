// Hugging Face folders of Llama (LlamaForCausalLM): a grouped-query model with an untied head
// and one with a tied head export to model.safetensors under Hugging Face's own names, [out, in]
// (no transposes), the padded vocabulary rows left out, checked byte for byte by hand; config.json
// holds every field LlamaConfig reads; the folder imports back bit for bit; a config.json that
// describes a Llama picotrain does not compute exactly is refused naming the key, and a head
// that is absent, present or different is checked against tie_word_embeddings. A trained Llama
// and a trained Mixtral (test_hf_mixtral.cpp) go out and back in, and a run resumes from them.
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

namespace {

// Hugging Face's LlamaForCausalLM state dict for kHfLlama's model (the MLP 48 wide), with the
// head or tied.
HfStateDict hf_state_dict(int64_t q, int64_t kv, bool tied) {
  return llama_family_state_dict(2, 200, 32, q, kv,
                                 {{"mlp.gate_proj.weight", {48, 32}},
                                  {"mlp.up_proj.weight", {48, 32}},
                                  {"mlp.down_proj.weight", {32, 48}}},
                                 tied);
}

}  // namespace

TEST_CASE("Llama Hugging Face folder: GQA, untied head; the bytes by hand, config.json, import bit for bit",
          "[ckpt][hf][llama]") {
  CkptFixture fx("hf_llama", 200);
  const ExportedModel x = export_random_model(fx, kHfLlama);
  const auto& [cfg, table, w, ckpt, hf] = x;
  REQUIRE(cfg.model.kv_heads() == 2);
  REQUIRE_FALSE(cfg.model.tied());

  SECTION("model.safetensors: Hugging Face's names and shapes in table order, raw [out, in] data") {
    const auto want = hf_state_dict(4 * 8, 2 * 8, false);
    // picotrain's names are Hugging Face's: the table lists exactly the state dict.
    REQUIRE(table.specs().size() == want.size());
    for (size_t i = 0; i < want.size(); i++) CHECK(table.specs()[i].name == want[i].first);
    check_f32_safetensors(hf + "/model.safetensors", table, w, want);
  }

  SECTION("config.json: every field LlamaConfig reads") {
    const json c = json::parse(read_text(hf + "/config.json"));
    check_llama_family_config(c, "LlamaForCausalLM", "llama", 48);
    CHECK(c["attention_bias"] == false);
    CHECK(c["mlp_bias"] == false);
    CHECK(c["pretraining_tp"] == 1);
  }

  SECTION("import gives back the model, its manifest and the weights, bit for bit") {
    const ModelSection back = check_import_bit_for_bit(fx, x);
    CHECK(back.ffn_width() == 48);
    CHECK_FALSE(back.tied());
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
          strip_model_prefix(ts);
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
    auto refused = [&](const std::function<void(json&)>& edit) { return config_refusal(hf, bad, out, edit); };
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

TEST_CASE("Llama and Mixtral Hugging Face folders: a trained model out and back in, and a run resumes from it",
          "[ckpt][hf][llama][mixtral]") {
  const std::vector<std::string> sets = GENERATE(values<std::vector<std::string>>({kHfLlama, kHfMixtral}));
  INFO(sets.back());
  CkptFixture fx("hf_llama_trained", 200);
  const std::vector<float> trained = train_and_save(fx.config(sets), 2);
  const std::string hf = (fx.dir / "hf").string(), imported = (fx.dir / "imported").string();
  CHECK(export_hf(fx.ckpt_dir(), hf, HfDtype::f32) == fx.step_dir(2));
  import_hf(hf, imported);
  const ParamTable table = build_param_table(fx.config(sets).model);
  CHECK(same_bytes(checkpoint_weights(imported, table), trained));

  CpuOps ops;
  const World world;
  Trainer t(fx.config(with(sets, {"checkpoint.resume=" + imported, "checkpoint.dir=" + (fx.dir / "ft").string()})),
            world, ops);
  CHECK(t.steps_done() == 0);
  CHECK(same_bytes(master_weights(t), trained));
}

TEST_CASE("Llama Hugging Face folder: a tied head is no tensor, and reads back tied", "[ckpt][hf][llama]") {
  CkptFixture fx("hf_llama_tied", 200);
  const ExportedModel x = export_random_model(fx, with(kHfLlama, {"model.tie_embeddings=true"}));
  const auto& [cfg, table, w, ckpt, hf] = x;
  REQUIRE(cfg.model.tied());
  CHECK_THROWS(table.get("lm_head.weight"));

  const SafetensorsFile f(hf + "/model.safetensors");
  const auto want = hf_state_dict(32, 16, true);
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
  ModelSection m = gpt2_vocab_llama();
  for (const bool tied : {false, true}) {
    m.tie_embeddings = tied;
    const ParamTable table = build_param_table(m);
    const std::vector<HfTensor> ts = check_llama_family_tensors(hf_llama(), table, m);
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
