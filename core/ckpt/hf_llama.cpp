// Llama as transformers' LlamaForCausalLM (models/llama: configuration_llama.py,
// modeling_llama.py), and what MixtralForCausalLM shares with it (hf_llama_family.h).
//
// Names: picotrain's Llama parameters are named as LlamaForCausalLM's state dict
// (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ..., model.norm.weight,
// lm_head.weight), so each rule maps a name to itself.
// Layout: every projection is an nn.Linear without bias, weight [out, in] like picotrain's: no
// transposes. The embedding and an untied head lose picotrain's padded vocabulary rows on the way
// out and get them back as zeros on the way in. A tied head is not a tensor in picotrain's table
// and save_pretrained leaves it out too; an older file that holds it must hold the embedding.
#include "core/ckpt/hf_llama_family.h"
#include "core/common/error.h"

namespace pt::ckpt {

std::vector<HfTensorRule> llama_family_rules(const std::vector<std::string>& mlp) {
  std::vector<HfTensorRule> rules = {{"model.embed_tokens.weight", "model.embed_tokens.weight", false, true}};
  std::vector<std::string> block = {"input_layernorm.weight",  "self_attn.q_proj.weight",
                                    "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                    "self_attn.o_proj.weight", "post_attention_layernorm.weight"};
  block.insert(block.end(), mlp.begin(), mlp.end());
  for (const std::string& name : block) {
    const std::string n = "model.layers.{L}." + name;
    rules.push_back({n, n, false, false});
  }
  rules.push_back({"model.norm.weight", "model.norm.weight", false, false});
  // Only an untied head is a parameter.
  rules.push_back({"lm_head.weight", "lm_head.weight", false, true, /*optional=*/true});
  return rules;
}

nlohmann::ordered_json llama_family_config_json(const ModelSection& m, HfDtype dtype, const char* class_name,
                                                const char* model_type, int intermediate_size,
                                                const nlohmann::ordered_json& own) {
  const nlohmann::ordered_json eot = end_of_text_id(m);
  nlohmann::ordered_json c = {
      {"architectures", {class_name}},
      {"model_type", model_type},
      {"vocab_size", m.vocab_size},  // unpadded: the padding rows are not exported
      {"hidden_size", m.d_model},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", m.n_layers},
      {"num_attention_heads", m.n_heads},
      {"num_key_value_heads", m.kv_heads()},
      {"head_dim", m.head_dim()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", m.max_seq_len},
      {"rms_norm_eps", m.eps()},
      {"rope_theta", m.rope_base()},
      {"rope_scaling", nullptr},  // plain RoPE: no NTK, linear, YaRN or Llama 3 rescaling
      {"attention_dropout", 0.0},  // picotrain trains without dropout
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"bos_token_id", eot},
      {"eos_token_id", eot},
      {"tie_word_embeddings", m.tied()},
  };
  for (const auto& [key, value] : own.items()) c[key] = value;
  c["torch_dtype"] = torch_dtype_name(dtype);
  return c;
}

ModelSection llama_family_model_from_config(const HfConfigKeys& k, const HfLlamaDefaults& d) {
  ModelSection m = read_decoder_shape(k, {{"vocab_size", d.vocab_size},
                                          {"max_position_embeddings", d.max_position_embeddings},
                                          {"hidden_size", d.hidden_size},
                                          {"num_hidden_layers", d.num_hidden_layers},
                                          {"num_attention_heads", d.num_attention_heads}});
  m.arch = "llama";
  m.ffn_hidden = k.whole("intermediate_size", d.intermediate_size);
  m.n_kv_heads = k.whole("num_key_value_heads", d.num_key_value_heads > 0 ? d.num_key_value_heads : m.n_heads);
  m.norm_eps = k.positive("rms_norm_eps", d.rms_norm_eps);
  if (m.norm_eps >= 1) throw k.fail("rms_norm_eps", k.at("rms_norm_eps").dump() + " is not below 1");
  m.rope_theta = k.positive("rope_theta", d.rope_theta);
  m.tie_embeddings = k.flag("tie_word_embeddings", false);

  if (m.n_heads % m.n_kv_heads != 0)
    throw k.fail("num_key_value_heads", std::to_string(m.n_kv_heads) + " does not divide num_attention_heads=" +
                                            std::to_string(m.n_heads));
  if (k.given("head_dim") && k.whole("head_dim", 0) != m.head_dim())
    throw k.fail("head_dim", k.at("head_dim").dump() + " is not supported: picotrain's head_dim is hidden_size / " +
                                 "num_attention_heads = " + std::to_string(m.head_dim()));
  if (m.head_dim() % 2 != 0)
    throw k.fail("num_attention_heads", "head_dim " + std::to_string(m.head_dim()) +
                                            " is odd; RoPE rotates pairs of dimensions");
  const std::string act = k.text("hidden_act", "silu");
  if (act != "silu")
    throw k.fail("hidden_act", "\"" + act + "\" is not supported: picotrain's Llama MLP is SwiGLU (silu)");
  // RoPE as picotrain computes it: theta^(-2i/head_dim) on every position, nothing rescaled. A
  // "default" rope type is that; every other (linear, dynamic, yarn, llama3, ...) is not.
  auto plain_rope = [&](const char* key) {
    if (!k.given(key)) return;
    const nlohmann::json& r = k.at(key);
    const nlohmann::json type = r.is_object() ? r.value("rope_type", r.value("type", nlohmann::json("default")))
                                              : nlohmann::json(nullptr);
    if (type != "default")
      throw k.fail(key, r.dump() + " is not supported: picotrain computes plain RoPE (rope_scaling null)");
  };
  plain_rope("rope_scaling");
  // transformers 5 folds rope_theta and rope_scaling into one rope_parameters object.
  plain_rope("rope_parameters");
  if (k.given("rope_parameters") && k.at("rope_parameters").contains("rope_theta")) {
    const HfConfigKeys rp(k.at("rope_parameters"), k.path() + " rope_parameters");
    m.rope_theta = rp.positive("rope_theta", m.rope_theta);
  }
  return m;
}

HfArchitecture llama_family_architecture() {
  HfArchitecture h;
  h.arch = "llama";
  h.param_table = &build_param_table;
  // A folder saved from the base model alone (LlamaModel, MixtralModel) names its tensors
  // without "model.".
  h.base_prefix = "model.";
  // rotary_emb.inv_freq was a persistent buffer in transformers before 4.38.
  h.ignored_suffixes = {".rotary_emb.inv_freq"};
  h.tied_head = "lm_head.weight";
  h.tied_to = "model.embed_tokens.weight";
  return h;
}

namespace {

nlohmann::ordered_json llama_config_json(const ModelSection& m, HfDtype dtype) {
  return llama_family_config_json(m, dtype, "LlamaForCausalLM", "llama", m.ffn_width(),
                                  {{"attention_bias", false}, {"mlp_bias", false}, {"pretraining_tp", 1}});
}

// config.json -> ModelSection. A key left out takes LlamaConfig's default, as transformers
// would read the file (rms_norm_eps 1e-6, rope_theta 10000, tie_word_embeddings false, ...);
// a value that makes transformers compute something picotrain's Llama does not is refused with
// the key, instead of importing weights that would give other logits.
ModelSection llama_model_from_config(const nlohmann::json& c, const std::string& path) {
  const HfConfigKeys k(c, path);
  // num_key_value_heads left out: num_attention_heads.
  const ModelSection m = llama_family_model_from_config(
      k, {.intermediate_size = 11008, .max_position_embeddings = 2048, .rms_norm_eps = 1e-6, .rope_theta = 10000.0});
  k.require("attention_bias", k.flag("attention_bias", false), false, "picotrain's Llama has no biases");
  k.require("mlp_bias", k.flag("mlp_bias", false), false, "picotrain's Llama has no biases");
  if (k.given("pretraining_tp") && k.whole("pretraining_tp", 1) != 1)
    throw k.fail("pretraining_tp",
                 k.at("pretraining_tp").dump() + " is not supported: picotrain computes each projection whole (1)");
  return m;
}

}  // namespace

const HfArchitecture& hf_llama() {
  static const HfArchitecture a = [] {
    HfArchitecture h = llama_family_architecture();
    h.model_type = "llama";
    h.class_name = "LlamaForCausalLM";
    h.rules = llama_family_rules({"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"});
    h.config_json = &llama_config_json;
    h.model_from_config = &llama_model_from_config;
    return h;
  }();
  return a;
}

}  // namespace pt::ckpt
