// Hugging Face folders of a Llama with experts (MixtralForCausalLM): the model exports under the
// names of the hub's Mixtral checkpoints (block_sparse_moe.gate, experts.E.w1/w3/w2), [out, in],
// the padded vocabulary rows left out, checked against the state dict written here by hand;
// config.json holds every field MixtralConfig reads; the folder imports back bit for bit with the
// same manifest; what Mixtral cannot hold (dense blocks, shared experts) is refused naming the
// key, and a config.json picotrain does not compute exactly is refused naming its key.
#include <catch2/catch.hpp>

#include <cstring>
#include <map>

#include "ckpt_test_support.h"
#include "core/ckpt/hf_model_folder.h"
#include "core/ckpt/manifest.h"
#include "core/cpu/cpu_ops.h"
#include "hf_test_support.h"
#include "run_test_support.h"

using namespace pt;
using namespace pt::test;
using namespace pt::ckpt;
using Catch::Matchers::Contains;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// 2 layers, d_model 32, 4 query heads over 2 key/value heads (head_dim 8), 4 experts of width 24
// in every block and 2 per token, vocabulary 200 padded to 256; eps, theta and the balancing
// loss's weight not the defaults, so the config shows they travel.
const std::vector<std::string> kMixtral = {"model.arch=llama",      "model.n_heads=4",      "model.n_kv_heads=2",
                                           "model.norm_eps=1e-6",   "model.rope_theta=500000", "moe.n_experts=4",
                                           "moe.top_k=2",           "moe.expert_hidden=24", "moe.aux_loss_coef=0.02"};

std::vector<std::string> with(std::vector<std::string> sets, const std::string& more) {
  sets.push_back(more);
  return sets;
}

// Hugging Face's MixtralForCausalLM state dict as the hub's checkpoints hold it, written out here
// from its modules: nn.Embedding [vocab, C]; per block MixtralRMSNorm [C], the attention's
// nn.Linear [out, in], and block_sparse_moe: the router gate [E, C] and each expert's w1 (gate)
// and w3 (up) [H, C] and w2 (down) [C, H]; the final norm and lm_head.
std::map<std::string, std::vector<int64_t>> hf_state_dict(int layers, int64_t vocab, int64_t C, int64_t q, int64_t kv,
                                                          int64_t E, int64_t H, bool tied) {
  std::map<std::string, std::vector<int64_t>> s = {{"model.embed_tokens.weight", {vocab, C}}};
  for (int l = 0; l < layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s[p + "input_layernorm.weight"] = {C};
    s[p + "self_attn.q_proj.weight"] = {q, C};
    s[p + "self_attn.k_proj.weight"] = {kv, C};
    s[p + "self_attn.v_proj.weight"] = {kv, C};
    s[p + "self_attn.o_proj.weight"] = {C, q};
    s[p + "post_attention_layernorm.weight"] = {C};
    s[p + "block_sparse_moe.gate.weight"] = {E, C};
    for (int e = 0; e < E; e++) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      s[x + "w1.weight"] = {H, C};
      s[x + "w2.weight"] = {C, H};
      s[x + "w3.weight"] = {H, C};
    }
  }
  s["model.norm.weight"] = {C};
  if (!tied) s["lm_head.weight"] = {vocab, C};
  return s;
}

// What export_hf says about a checkpoint: its error, or "(exported)".
std::string export_error(const std::string& ckpt, const std::string& out) {
  try {
    export_hf(ckpt, out, HfDtype::f32);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(exported)";
}

}  // namespace

TEST_CASE("Mixtral Hugging Face folder: the state dict by hand, config.json, import bit for bit",
          "[ckpt][hf][mixtral]") {
  CkptFixture fx("hf_mixtral", 200);
  const RunConfig cfg = fx.config(kMixtral);
  const ModelSection& m = cfg.model;
  REQUIRE(m.padded_vocab == 256);
  const ParamTable table = build_param_table(m);
  const std::vector<float> w = random_weights(table);
  const std::string ckpt = write_weights_checkpoint(fx, m, w, "ckpt");
  const std::string hf = (fx.dir / "hf").string();
  CHECK(export_hf(ckpt, hf, HfDtype::f32) == ckpt + "/step_00000000");
  CHECK(is_hf_model_folder(hf));

  SECTION("model.safetensors: the hub's Mixtral names and shapes, raw [out, in] data") {
    const auto want = hf_state_dict(2, 200, 32, 4 * 8, 2 * 8, 4, 24, false);
    // picotrain's names are Hugging Face's: the table is exactly the state dict.
    std::map<std::string, std::vector<int64_t>> names;
    for (const ParamSpec& p : table.specs()) names[p.name] = p.global_shape;
    CHECK(names.size() == want.size());
    for (const auto& [name, shape] : want) {
      INFO(name);
      CHECK(names.count(name) == 1);
    }

    const std::vector<char> bytes = file_bytes(hf + "/model.safetensors");
    REQUIRE(bytes.size() >= 8);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    REQUIRE(8 + n <= bytes.size());
    const ojson h = ojson::parse(std::string(bytes.data() + 8, n));
    REQUIRE(h.size() == want.size() + 1);
    const char* data = bytes.data() + 8 + n;
    for (const auto& [name, shape] : want) {
      INFO(name);
      REQUIRE(h.contains(name));
      const ojson& e = h[name];
      CHECK(e["dtype"] == "F32");
      CHECK(e["shape"].get<std::vector<int64_t>>() == shape);
      // The first rows of picotrain's tensor as they are: no transpose, padding rows dropped.
      const ParamSpec& p = table.get(name);
      const auto at = e["data_offsets"].get<std::vector<uint64_t>>();
      size_t numel = 1;
      for (int64_t d : shape) numel *= static_cast<size_t>(d);
      REQUIRE(at[1] - at[0] == numel * 4);
      CHECK(std::memcmp(data + at[0], w.data() + p.offset, numel * 4) == 0);
    }
  }

  SECTION("config.json: every field MixtralConfig reads") {
    const json c = json::parse(read_text(hf + "/config.json"));
    CHECK(c["architectures"] == json{"MixtralForCausalLM"});
    CHECK(c["model_type"] == "mixtral");
    CHECK(c["vocab_size"] == 200);
    CHECK(c["hidden_size"] == 32);
    CHECK(c["intermediate_size"] == 24);  // one expert's width
    CHECK(c["num_hidden_layers"] == 2);
    CHECK(c["num_attention_heads"] == 4);
    CHECK(c["num_key_value_heads"] == 2);
    CHECK(c["head_dim"] == 8);
    CHECK(c["hidden_act"] == "silu");
    CHECK(c["max_position_embeddings"] == 64);
    CHECK(c["rms_norm_eps"] == 1e-6);
    CHECK(c["rope_theta"] == 500000.0);
    CHECK(c["rope_scaling"].is_null());
    CHECK(c["sliding_window"].is_null());
    CHECK(c["num_local_experts"] == 4);
    CHECK(c["num_experts_per_tok"] == 2);
    CHECK(c["router_aux_loss_coef"] == 0.02);
    CHECK(c["output_router_logits"] == false);
    CHECK(c["router_jitter_noise"] == 0.0);
    CHECK(c["tie_word_embeddings"] == false);
    CHECK(c["attention_dropout"] == 0.0);
    CHECK(c["initializer_range"] == 0.02);
    CHECK(c["torch_dtype"] == "float32");
    CHECK(c["bos_token_id"].is_null());  // no <|endoftext|> in a 200-token vocabulary
    CHECK(c["eos_token_id"].is_null());
    // Llama's own keys are not Mixtral's.
    CHECK_FALSE(c.contains("mlp_bias"));
    CHECK_FALSE(c.contains("pretraining_tp"));
  }

  SECTION("import gives back the model, its manifest and the weights, bit for bit") {
    const std::string imported = (fx.dir / "imported").string();
    CHECK(import_hf(hf, imported) == imported + "/step_00000000");
    CHECK(same_bytes(checkpoint_weights(imported, table), w));
    CheckpointReader r(resolve_checkpoint_path(imported, "test"));
    CheckpointReader orig(resolve_checkpoint_path(ckpt, "test"));
    CHECK(r.manifest().model == model_shape_json(m));
    CHECK(r.manifest().model == orig.manifest().model);
    // Every master tensor's chunks carry the same checksums as the exported checkpoint's.
    REQUIRE(r.manifest().tensors.size() == orig.manifest().tensors.size());
    for (size_t i = 0; i < r.manifest().tensors.size(); i++) {
      const TensorEntry &a = r.manifest().tensors[i], &b = orig.manifest().tensors[i];
      INFO(a.name);
      CHECK(a.name == b.name);
      REQUIRE(a.chunks.size() == b.chunks.size());
      for (size_t c = 0; c < a.chunks.size(); c++) CHECK(a.chunks[c].checksum == b.chunks[c].checksum);
    }
    const ModelSection back = model_from_manifest(r.manifest(), imported);
    CHECK(back.moe.n_experts == 4);
    CHECK(back.moe.top_k == 2);
    CHECK(back.moe.expert_hidden == 24);
    CHECK(back.moe.every == 1);
    CHECK(back.moe.n_shared_experts == 0);
    CHECK(back.moe.aux_loss_coef == 0.02);
    CHECK(back.kv_heads() == 2);
    CHECK(back.eps() == 1e-6);
    CHECK(back.rope_base() == 500000.0);
  }

  SECTION("folders saved otherwise: MixtralModel's bare names, hub configs, keys left to MixtralConfig") {
    const std::string other = (fx.dir / "other").string();
    rewrite_folder(
        hf, other,
        [](std::vector<LoadedTensor>& ts) {
          for (auto& t : ts)
            if (t.name.rfind("model.", 0) == 0) t.name = t.name.substr(6);
        },
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
    auto refused = [&](const std::function<void(json&)>& edit) {
      rewrite_folder(
          hf, bad, [](auto&) {}, edit);
      return import_error(bad, out);
    };
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
      const ModelSection m = fx.config(with(kMixtral, set)).model;
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

TEST_CASE("Mixtral Hugging Face folder: a trained model out and back in, and a run resumes from it",
          "[ckpt][hf][mixtral]") {
  CkptFixture fx("hf_mixtral_trained", 200);
  std::vector<float> trained;
  {
    CpuOps ops;
    const World world;
    Trainer t(fx.config(kMixtral), world, ops);
    for (int i = 0; i < 2; i++) t.step();
    t.save_checkpoint();
    trained = master_weights(t);
  }
  const std::string hf = (fx.dir / "hf").string(), imported = (fx.dir / "imported").string();
  CHECK(export_hf(fx.ckpt_dir(), hf, HfDtype::f32) == fx.step_dir(2));
  import_hf(hf, imported);
  const ParamTable table = build_param_table(fx.config(kMixtral).model);
  CHECK(same_bytes(checkpoint_weights(imported, table), trained));

  CpuOps ops;
  const World world;
  Trainer t(fx.config(with(with(kMixtral, "checkpoint.resume=" + imported),
                           "checkpoint.dir=" + (fx.dir / "ft").string())),
            world, ops);
  CHECK(t.steps_done() == 0);
  CHECK(same_bytes(master_weights(t), trained));
}

TEST_CASE("Mixtral Hugging Face table: every parameter has its rule; the forms by model and by model_type",
          "[ckpt][hf][mixtral]") {
  ModelSection m;
  m.arch = "llama";
  m.n_layers = 3;
  m.d_model = 64;
  m.n_heads = 8;
  m.n_kv_heads = 2;
  m.vocab_size = 50257;
  m.padded_vocab = 50304;
  m.max_seq_len = 128;
  m.moe.n_experts = 8;
  m.moe.top_k = 2;
  m.moe.expert_hidden = 96;
  const ParamTable table = build_param_table(m);
  const std::vector<HfTensor> ts = hf_tensors(hf_mixtral(), table, m);
  REQUIRE(ts.size() == table.specs().size());
  for (const HfTensor& t : ts) {
    CHECK(t.name == t.param->name);
    CHECK_FALSE(t.transpose);
  }
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
