// GPT-2 as transformers' GPT2LMHeadModel (models/gpt2: configuration_gpt2.py, modeling_gpt2.py).
//
// Names: GPT2LMHeadModel holds the body as `transformer` (GPT2Model: wte, wpe, h.N, ln_f) and
// a head tied to wte, which save_pretrained leaves out; so do we. picotrain's names are the
// body's, so each rule adds the "transformer." prefix.
// Layout: GPT-2's projections are Conv1D, y = x @ W + b with W stored [in, out], the transpose
// of picotrain's (and llm.c's) [out, in]; LayerNorms, biases and embeddings are the same.
#include <cmath>

#include "core/ckpt/hf_architecture.h"
#include "core/ckpt/hf_config_keys.h"
#include "core/common/error.h"

namespace pt::ckpt {

namespace {

std::vector<HfTensorRule> gpt2_rules() {
  std::vector<HfTensorRule> rules = {
      {"wte", "transformer.wte.weight", false, true},
      {"wpe", "transformer.wpe.weight", false, false},
  };
  // (name in a block, a Conv1D weight)
  const std::pair<const char*, bool> block[] = {
      {"ln_1.weight", false},      {"ln_1.bias", false},         {"attn.c_attn.weight", true},
      {"attn.c_attn.bias", false}, {"attn.c_proj.weight", true}, {"attn.c_proj.bias", false},
      {"ln_2.weight", false},      {"ln_2.bias", false},         {"mlp.c_fc.weight", true},
      {"mlp.c_fc.bias", false},    {"mlp.c_proj.weight", true},  {"mlp.c_proj.bias", false},
  };
  for (const auto& [name, conv1d] : block)
    rules.push_back({std::string("h.{L}.") + name, std::string("transformer.h.{L}.") + name, conv1d, false});
  rules.push_back({"ln_f.weight", "transformer.ln_f.weight", false, false});
  rules.push_back({"ln_f.bias", "transformer.ln_f.bias", false, false});
  return rules;
}

nlohmann::ordered_json gpt2_config_json(const ModelSection& m, HfDtype dtype) {
  const nlohmann::ordered_json eot = end_of_text_id(m);
  return {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", m.vocab_size},  // unpadded: the padding rows are not exported
      {"n_positions", m.max_seq_len},
      {"n_ctx", m.max_seq_len},  // older transformers read the context length from here
      {"n_embd", m.d_model},
      {"n_layer", m.n_layers},
      {"n_head", m.n_heads},
      {"n_inner", nullptr},  // 4 * n_embd
      // The tanh approximation of GELU, as picotrain (and OpenAI's GPT-2) compute it.
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", 1e-5},
      {"scale_attn_weights", true},  // 1/sqrt(head_dim)
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"add_cross_attention", false},
      // picotrain trains without dropout; training on in transformers continues the same model.
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"bos_token_id", eot},
      {"eos_token_id", eot},
      {"tie_word_embeddings", true},
      {"torch_dtype", torch_dtype_name(dtype)},
  };
}

// config.json -> ModelSection. A key left out takes GPT2Config's default, as transformers
// would read the file (the shape and the vocabulary's padding: read_decoder_shape); a value that
// changes what the model computes away from picotrain's GPT-2 is refused with the key, instead of
// importing weights that would give other logits.
ModelSection gpt2_model_from_config(const nlohmann::json& c, const std::string& path) {
  const HfConfigKeys k(c, path);
  auto fail = [&](const std::string& key, const std::string& why) { return k.fail(key, why); };

  ModelSection m = read_decoder_shape(
      k, {{"vocab_size", 50257}, {"n_positions", 1024}, {"n_embd", 768}, {"n_layer", 12}, {"n_head", 12}});
  m.arch = "gpt2";
  if (k.given("n_inner") && k.at("n_inner") != nlohmann::json(4 * m.d_model))
    throw fail("n_inner", k.at("n_inner").dump() +
                              " is not supported: picotrain's MLP is 4 * n_embd = " + std::to_string(4 * m.d_model));
  const std::string act = k.text("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw fail("activation_function", "\"" + act +
                                          "\" is not supported: picotrain computes tanh-approximate GELU "
                                          "(gelu_new, gelu_pytorch_tanh)");
  if (c.contains("layer_norm_epsilon")) {
    const nlohmann::json& eps = c["layer_norm_epsilon"];
    if (!eps.is_number() || eps.get<double>() != 1e-5)
      throw fail("layer_norm_epsilon", eps.dump() + " is not supported: picotrain's GPT-2 LayerNorm uses 1e-5");
  }
  k.require("scale_attn_weights", k.flag("scale_attn_weights", true), true,
            "picotrain scales attention by 1/sqrt(head_dim)");
  k.require("scale_attn_by_inverse_layer_idx", k.flag("scale_attn_by_inverse_layer_idx", false), false,
            "picotrain does not scale attention by layer");
  k.require("add_cross_attention", k.flag("add_cross_attention", false), false,
            "picotrain's GPT-2 is decoder-only");
  k.require("tie_word_embeddings", k.flag("tie_word_embeddings", true), true,
            "picotrain's GPT-2 ties its head to the token embedding");
  return m;
}

}  // namespace

const HfArchitecture& hf_gpt2() {
  static const HfArchitecture a = [] {
    HfArchitecture h;
    h.arch = "gpt2";
    h.model_type = "gpt2";
    h.class_name = "GPT2LMHeadModel";
    h.rules = gpt2_rules();
    h.param_table = &build_param_table;
    h.config_json = &gpt2_config_json;
    h.model_from_config = &gpt2_model_from_config;
    h.base_prefix = "transformer.";
    // The causal mask (and its fill value) were persistent buffers before transformers 4.31.
    h.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};
    h.tied_head = "lm_head.weight";
    h.tied_to = "transformer.wte.weight";
    return h;
  }();
  return a;
}

}  // namespace pt::ckpt
