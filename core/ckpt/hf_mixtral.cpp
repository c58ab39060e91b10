// A Llama with experts as transformers' MixtralForCausalLM (models/mixtral:
// configuration_mixtral.py, modeling_mixtral.py): every block sparse (moe.every=1), no shared
// experts. Mixtral routes as picotrain does (core/model/moe_layer.h): a softmax over all the
// experts, each token's top num_experts_per_tok, their weights renormalised to sum to 1.
//
// Names: the Mixtral checkpoints on the Hugging Face hub name a block's sparse MLP
// block_sparse_moe: its router gate.weight [E, C] and expert e's w1 (gate) [H, C], w3 (up)
// [H, C] and w2 (down) [C, H], each an nn.Linear [out, in]. picotrain's parameters are named so
// (core/model/architecture.cpp), and the rest of the model as Llama's (hf_llama_family.h): each
// rule maps a name to itself, nothing is transposed. transformers 5 fuses each block's experts
// in memory (mlp.experts.gate_up_proj) but reads folders of these names (its checkpoint
// conversion mapping), so such a folder loads in every version.
// config.json: Llama's keys with intermediate_size the width of one expert, num_local_experts,
// num_experts_per_tok and router_aux_loss_coef (moe.aux_loss_coef). That coefficient weighs
// transformers' balancing loss, which it computes over the tokens of every block at once where
// picotrain averages each sparse block's loss (moe_layer.h): the same for one sparse block,
// alike in scale for several.
#include "core/ckpt/hf_llama_family.h"
#include "core/common/error.h"
#include "core/model/architecture.h"

namespace pt::ckpt {

namespace {

std::string mixtral_cannot_hold(const ModelSection& m) {
  const MoeSection& e = m.moe;
  if (e.every != 1)
    return "moe.every=" + std::to_string(e.every) + " has no Hugging Face form: every block of a " +
           "MixtralForCausalLM is sparse (moe.every=1), and this model's block 0 is dense";
  if (e.n_shared_experts != 0)
    return "moe.n_shared_experts=" + std::to_string(e.n_shared_experts) + " has no Hugging Face form: " +
           "MixtralForCausalLM has no shared experts (moe.n_shared_experts=0)";
  return {};
}

nlohmann::ordered_json mixtral_config_json(const ModelSection& m, HfDtype dtype) {
  const MoeSection& e = m.moe;
  return llama_family_config_json(m, dtype, "MixtralForCausalLM", "mixtral", describe_architecture(m).expert_hidden,
                                  {
                                      {"num_local_experts", e.n_experts},
                                      {"num_experts_per_tok", e.top_k},
                                      {"router_aux_loss_coef", e.aux_loss_coef},
                                      {"output_router_logits", false},
                                      {"router_jitter_noise", 0.0},  // picotrain's router sees its input as is
                                      {"sliding_window", nullptr},   // causal attention over every position
                                  });
}

// config.json -> ModelSection. A key left out takes MixtralConfig's default, as transformers
// would read the file (8 experts, 2 per token, 8 key/value heads, rms_norm_eps 1e-5, rope_theta
// 1e6, ...). router_jitter_noise (noise on the router's input while training) and
// output_router_logits change no logit: they are accepted and not kept.
ModelSection mixtral_model_from_config(const nlohmann::json& c, const std::string& path) {
  const HfConfigKeys k(c, path);
  ModelSection m = llama_family_model_from_config(k, {.intermediate_size = 14336,
                                                      .num_key_value_heads = 8,
                                                      .max_position_embeddings = 4096 * 32,
                                                      .rms_norm_eps = 1e-5,
                                                      .rope_theta = 1e6});
  MoeSection& e = m.moe;
  // intermediate_size is each expert's width; no block has a dense MLP (model_shape_json
  // leaves ffn_hidden out then, so it stays unset here).
  e.expert_hidden = m.ffn_hidden;
  m.ffn_hidden = 0;
  e.n_experts = k.whole("num_local_experts", 8);
  e.top_k = k.whole("num_experts_per_tok", 2);
  if (e.top_k > e.n_experts)
    throw k.fail("num_experts_per_tok", std::to_string(e.top_k) + " is more than num_local_experts=" +
                                            std::to_string(e.n_experts));
  e.every = 1;
  e.n_shared_experts = 0;
  e.aux_loss_coef = k.non_negative("router_aux_loss_coef", 0.001);
  if (k.given("sliding_window") && k.whole("sliding_window", 1) < m.max_seq_len)
    throw k.fail("sliding_window", k.at("sliding_window").dump() +
                                       " is not supported: picotrain's attention sees every earlier position " +
                                       "(null, or at least max_position_embeddings=" + std::to_string(m.max_seq_len) +
                                       ")");
  return m;
}

}  // namespace

const HfArchitecture& hf_mixtral() {
  static const HfArchitecture a = [] {
    HfArchitecture h = llama_family_architecture();
    h.experts = true;
    h.model_type = "mixtral";
    h.class_name = "MixtralForCausalLM";
    h.rules = llama_family_rules({"block_sparse_moe.gate.weight", "block_sparse_moe.experts.{E}.w1.weight",
                                  "block_sparse_moe.experts.{E}.w3.weight", "block_sparse_moe.experts.{E}.w2.weight"});
    h.config_json = &mixtral_config_json;
    h.model_from_config = &mixtral_model_from_config;
    h.cannot_hold = &mixtral_cannot_hold;
    return h;
  }();
  return a;
}

}  // namespace pt::ckpt
