// Hugging Face folders of a Llama with experts (MixtralForCausalLM): the model exports under the
// names of the hub's Mixtral checkpoints (block_sparse_moe.gate, experts.E.w1/w3/w2), [out, in],
// the padded vocabulary rows left out, checked against the state dict written here by hand;
// config.json holds every field MixtralConfig reads; the folder imports back bit for bit with the
// same manifest; what Mixtral cannot hold (dense blocks, shared experts) is refused naming the
// key, and a config.json picotrain does not compute exactly is refused naming its key. A trained
// Mixtral goes out and back in, and a run resumes from it, with the trained Llama in
// test_hf_llama.cpp.
#include <catch2/catch.hpp>

#include <map>

#include "ckpt_test_support.h"
#include "core/ckpt/hf_model_folder.h"
#include "core/ckpt/manifest.h"
#include "hf_test_support.h"
#include "run_test_support.h"

using namespace pt;
using namespace pt::test;
using namespace pt::ckpt;

namespace {

// Hugging Face's MixtralForCausalLM state dict for kHfMixtral's model as the hub's checkpoints
// hold it, written out here from its modules: per block, after the norms and the attention,
// block_sparse_moe: the router gate [E, C] and each expert's w1 (gate) and w3 (up) [H, C] and
// w2 (down) [C, H], each an nn.Linear [out, in].
HfStateDict hf_state_dict(int64_t E, int64_t H) {
  HfStateDict moe = {{"block_sparse_moe.gate.weight", {E, 32}}};
  for (int e = 0; e < E; e++) {
    const std::string x = "block_sparse_moe.experts." + std::to_string(e) + ".";
    moe.push_back({x + "w1.weight", {H, 32}});
    moe.push_back({x + "w2.weight", {32, H}});
    moe.push_back({x + "w3.weight", {H, 32}});
  }
  return llama_family_state_dict(2, 200, 32, 4 * 8, 2 * 8, moe, false);
}

}  // namespace

TEST_CASE("Mixtral Hugging Face folder: the state dict by hand, config.json, import bit for bit",
          "[ckpt][hf][mixtral]") {
  CkptFixture fx("hf_mixtral", 200);
  const ExportedModel x = export_random_model(fx, kHfMixtral);
  const ModelSection& m = x.cfg.model;
  const auto& [cfg, table, w, ckpt, hf] = x;

  SECTION("model.safetensors: the hub's Mixtral names and shapes, raw [out, in] data") {
    const auto want = hf_state_dict(4, 24);
    // picotrain's names are Hugging Face's: the table is exactly the state dict.
    std::map<std::string, std::vector<int64_t>> names;
    for (const ParamSpec& p : table.specs()) names[p.name] = p.global_shape;
    CHECK(names.size() == want.size());
    for (const auto& [name, shape] : want) {
      INFO(name);
      CHECK(names.count(name) == 1);
    }
    check_f32_safetensors(hf + "/model.safetensors", table, w, want);
  }

  SECTION("config.json: every field MixtralConfig reads") {
    const json c = json::parse(read_text(hf + "/config.json"));
    check_llama_family_config(c, "MixtralForCausalLM", "mixtral", 24);  // one expert's width
    CHECK(c["sliding_window"].is_null());
    CHECK(c["num_local_experts"] == 4);
    CHECK(c["num_experts_per_tok"] == 2);
    CHECK(c["router_aux_loss_coef"] == 0.02);
    CHECK(c["output_router_logits"] == false);
    CHECK(c["router_jitter_noise"] == 0.0);
    // Llama's own keys are not Mixtral's.
    CHECK_FALSE(c.contains("mlp_bias"));
    CHECK_FALSE(c.contains("pretraining_tp"));
  }

  SECTION("import gives back the model, its manifest and the weights, bit for bit") {
    check_tiny_moe(check_import_bit_for_bit(fx, x).moe);
  }

  SECTION("folders saved otherwise: MixtralModel's bare names, hub configs, keys left to MixtralConfig") {
    const std::string other = (fx.dir / "other").string();
    rewrite_folder(
        hf, other,
        strip_model_prefix,
        [](json& c) {
          c["sliding_window"] = 64;         // the whole context: plain causal attention
          c["router_jitter_noise"] = 0.01;  // training noise: no logit changes
          c["output_router_logits"] = true;
          c.erase("router_aux_loss_coef");  // MixtralConfig's 0.001
          c.erase("head_dim");
        });
    const std::string imported = (fx.dir / "imported_other").string();
    import_hf(other, imported);
    CHECK(same_bytes(checkpoint_weights(imported, table), w));
    const ModelSection back =
        model_from_manifest(CheckpointReader(resolve_checkpoint_path(imported, "t")).manifest(), imported);
    CHECK(back.moe.aux_loss_coef == 0.001);
    CHECK(model_shape_json(back) == model_shape_json(m));
  }

  SECTION("import refuses a config.json picotrain does not compute exactly, naming the key") {
    const std::string bad = (fx.dir / "badcfg").string(), out = (fx.dir / "never").string();
    auto refused = [&](const std::function<void(json&)>& edit) { return config_refusal(hf, bad, out, edit); };
    CHECK_THAT(refused([](json& c) { c["num_experts_per_tok"] = 5; }),
               Contains("\"num_experts_per_tok\": 5 is more than num_local_experts=4"));
    CHECK_THAT(refused([](json& c) { c["sliding_window"] = 16; }),
               Contains("\"sliding_window\": 16 is not supported: picotrain's attention sees every earlier position"));
    CHECK_THAT(refused([](json& c) { c["router_aux_loss_coef"] = -1; }),
               Contains("\"router_aux_loss_coef\": -1 is not a number >= 0"));
    CHECK_THAT(refused([](json& c) { c["num_local_experts"] = 0; }),
               Contains("\"num_local_experts\": 0 is not a whole number >= 1"));
    // The keys shared with Llama are read and checked alike.
    CHECK_THAT(refused([](json& c) { c["hidden_act"] = "gelu"; }),
               Contains("\"hidden_act\": \"gelu\" is not supported"));
    CHECK_THAT(refused([](json& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}}; }),
               Contains("\"rope_scaling\""));
    // MixtralConfig's default is 8 key/value heads, which 4 query heads cannot share.
    CHECK_THAT(refused([](json& c) { c.erase("num_key_value_heads"); }),
               Contains("\"num_key_value_heads\": 8 does not divide num_attention_heads=4"));
    // The shapes and experts the config implies are checked against the file's.
    CHECK_THAT(refused([](json& c) { c["intermediate_size"] = 32; }),
               Contains("tensor model.layers.0.block_sparse_moe.experts.0.w1.weight has shape [24, 32], expected "
                        "[32, 32]"));
    CHECK_THAT(refused([](json& c) { c["num_local_experts"] = 5; }),
               Contains("tensor model.layers.0.block_sparse_moe.gate.weight has shape [4, 32], expected [5, 32]"));
    // The router and the experts both say 3: the fourth expert is then no parameter.
    CHECK_THAT(refused([](json& c) { c["num_local_experts"] = 3; }),
               Contains("tensor model.layers.0.block_sparse_moe.gate.weight has shape [4, 32], expected [3, 32]"));
    const std::string extra = (fx.dir / "extra").string();
    rewrite_folder(
        hf, extra,
        [](std::vector<LoadedTensor>& ts) {
          std::erase_if(ts, [](const LoadedTensor& t) { return t.name.find("experts.3.") != std::string::npos; });
          for (auto& t : ts)
            if (t.name.ends_with("block_sparse_moe.gate.weight")) {
              t.shape = {3, 32};
              t.data.resize(3 * 32);
            }
          ts.push_back({"model.layers.1.block_sparse_moe.experts.3.w2.weight", {32, 24}, std::vector<float>(32 * 24)});
        },
        [](json& c) { c["num_local_experts"] = 3; });
    CHECK_THAT(import_error(extra, out),
               Contains("tensor model.layers.1.block_sparse_moe.experts.3.w2.weight is not a parameter of "
                        "MixtralForCausalLM"));
    // A Mixtral is no Llama: its folder relabelled lacks every dense MLP.
    CHECK_THAT(refused([](json& c) {
                 c["model_type"] = "llama";
                 c["architectures"] = {"LlamaForCausalLM"};
               }),
               Contains("has no tensor model.layers.0.mlp.gate_proj.weight, which the LlamaForCausalLM"));
    CHECK_FALSE(fs::exists(out));
  }
}

TEST_CASE("Mixtral Hugging Face folder: what Mixtral cannot hold is refused naming the key", "[ckpt][hf][mixtral]") {
  CkptFixture fx("hf_mixtral_refused", 200);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"moe.every=2", "convert --format hf: moe.every=2 has no Hugging Face form: every block of a "
                      "MixtralForCausalLM is sparse (moe.every=1)"},
      {"moe.n_shared_experts=1", "convert --format hf: moe.n_shared_experts=1 has no Hugging Face form: "
                                 "MixtralForCausalLM has no shared experts"},
  };
  for (const auto& [set, want] : cases) {
    DYNAMIC_SECTION(set) {
      const ModelSection m = fx.config(with(kHfMixtral, {set})).model;
      CHECK_THROWS_AS(hf_architecture_for_model(m), ConfigError);
      const std::string ckpt = write_weights_checkpoint(fx, m, random_weights(build_param_table(m)), "ckpt");
      const std::string out = (fx.dir / "hf").string();
      CHECK_THAT(export_error(ckpt, out), Contains(want));
      CHECK_FALSE(fs::exists(out));  // refused before anything is written

      // From the command line: a usage error (exit 2), one error line.
      const Launch l = run_command(std::string(PICOTRAIN_BIN) + " convert --from " + ckpt + " --to " + out +
                                   " --format hf");
      INFO(l.output);
      CHECK(l.exit_code == 2);
      CHECK_THAT(l.output, Contains("error: " + want));
    }
  }
}

TEST_CASE("Mixtral Hugging Face table: every parameter has its rule; the forms by model and by model_type",
          "[ckpt][hf][mixtral]") {
  ModelSection m = gpt2_vocab_llama();
  m.moe.n_experts = 8;
  m.moe.top_k = 2;
  m.moe.expert_hidden = 96;
  const ParamTable table = build_param_table(m);
  check_llama_family_tensors(hf_mixtral(), table, m);
  const ojson c = hf_mixtral().config_json(m, HfDtype::bf16);
  CHECK(c["intermediate_size"] == 96);
  CHECK(c["num_local_experts"] == 8);
  CHECK(c["bos_token_id"] == 50256);  // GPT-2's tokenizer: <|endoftext|>
  CHECK(c["torch_dtype"] == "bfloat16");
  // A Llama with experts is a Mixtral, without them a Llama.
  CHECK(&hf_architecture_for_model(m) == &hf_mixtral());
  CHECK(&hf_architecture_for_model_type("mixtral", "x") == &hf_mixtral());
  m.moe.n_experts = 0;
  CHECK(&hf_architecture_for_model(m) == &hf_llama());
  // The Llama table has no name for an expert; the Mixtral table none for a dense MLP.
  m.moe.n_experts = 8;
  CHECK_THROWS_WITH(hf_tensors(hf_llama(), table, m),
                    Contains("no Hugging Face name for parameter model.layers.0.block_sparse_moe.gate.weight"));
  m.moe.n_experts = 0;
  CHECK_THROWS_WITH(hf_tensors(hf_mixtral(), build_param_table(m), m),
                    Contains("no Hugging Face name for parameter model.layers.0.mlp.gate_proj.weight"));
}
