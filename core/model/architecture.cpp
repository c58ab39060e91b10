#include "core/model/architecture.h"

#include <algorithm>

#include "core/common/error.h"

namespace pt {

const char* to_string(ParamRole r) {
  switch (r) {
    case ParamRole::token_embedding: return "token_embedding";
    case ParamRole::position_embedding: return "position_embedding";
    case ParamRole::norm1: return "norm1";
    case ParamRole::norm1_bias: return "norm1_bias";
    case ParamRole::qkv: return "qkv";
    case ParamRole::qkv_bias: return "qkv_bias";
    case ParamRole::attn_out: return "attn_out";
    case ParamRole::attn_out_bias: return "attn_out_bias";
    case ParamRole::norm2: return "norm2";
    case ParamRole::norm2_bias: return "norm2_bias";
    case ParamRole::mlp_up: return "mlp_up";
    case ParamRole::mlp_up_bias: return "mlp_up_bias";
    case ParamRole::mlp_down: return "mlp_down";
    case ParamRole::mlp_down_bias: return "mlp_down_bias";
    case ParamRole::final_norm: return "final_norm";
    case ParamRole::final_norm_bias: return "final_norm_bias";
    case ParamRole::head: return "head";
    case ParamRole::moe_router: return "moe_router";
    case ParamRole::expert_up: return "expert_up";
    case ParamRole::expert_down: return "expert_down";
  }
  return "?";
}

int Architecture::max_mlp_hidden() const {
  int widest = 0;
  for (int l = 0; l < n_layers; l++) widest = std::max(widest, mlp_hidden(l));
  return widest;
}

Architecture describe_architecture(const ModelSection& m) {
  Architecture a;
  a.name = m.arch;
  a.n_layers = m.n_layers;
  a.d_model = m.d_model;
  a.n_heads = m.n_heads;
  a.n_kv_heads = m.kv_heads();
  a.head_dim = m.head_dim();
  a.ffn_hidden = m.ffn_width();
  a.vocab_size = m.vocab_size;
  a.padded_vocab = m.padded_vocab > 0 ? m.padded_vocab : m.vocab_size;
  a.max_seq_len = m.max_seq_len;
  a.norm_eps = static_cast<float>(m.eps());
  a.tied_head = m.tied();
  if (m.arch == "gpt2") return a;  // the defaults above are GPT-2's
  if (m.arch == "llama") {
    a.norm = NormKind::rmsnorm;
    a.mlp = MlpKind::swiglu;
    a.positions = PositionKind::rope;
    a.biases = false;
    a.rope_theta = static_cast<float>(m.rope_base());
    a.scaled_residual_init = false;
    const MoeSection& e = m.moe;
    if (e.enabled()) {
      a.n_experts = e.n_experts;
      a.top_k = e.top_k;
      a.expert_hidden = e.expert_hidden > 0 ? e.expert_hidden : a.ffn_hidden;
      a.moe_every = e.every;
      a.n_shared_experts = e.n_shared_experts;
      a.aux_loss_coef = static_cast<float>(e.aux_loss_coef);
    }
    return a;
  }
  throw ConfigError("model.arch=\"" + m.arch + "\" must be one of gpt2, llama");
}

}  // namespace pt

namespace pt {

namespace {

// GPT-2: Hugging Face's GPT-2 names without the "transformer." prefix (llm.c's order); q|k|v
// is one tensor (c_attn), as is the MLP's up-projection (c_fc).
std::vector<std::string> gpt2_names(ParamRole r, int layer) {
  const std::string h = "h." + std::to_string(layer) + ".";
  switch (r) {
    case ParamRole::token_embedding: return {"wte"};
    case ParamRole::position_embedding: return {"wpe"};
    case ParamRole::norm1: return {h + "ln_1.weight"};
    case ParamRole::norm1_bias: return {h + "ln_1.bias"};
    case ParamRole::qkv: return {h + "attn.c_attn.weight"};
    case ParamRole::qkv_bias: return {h + "attn.c_attn.bias"};
    case ParamRole::attn_out: return {h + "attn.c_proj.weight"};
    case ParamRole::attn_out_bias: return {h + "attn.c_proj.bias"};
    case ParamRole::norm2: return {h + "ln_2.weight"};
    case ParamRole::norm2_bias: return {h + "ln_2.bias"};
    case ParamRole::mlp_up: return {h + "mlp.c_fc.weight"};
    case ParamRole::mlp_up_bias: return {h + "mlp.c_fc.bias"};
    case ParamRole::mlp_down: return {h + "mlp.c_proj.weight"};
    case ParamRole::mlp_down_bias: return {h + "mlp.c_proj.bias"};
    case ParamRole::final_norm: return {"ln_f.weight"};
    case ParamRole::final_norm_bias: return {"ln_f.bias"};
    case ParamRole::head: return {};  // tied
    default: return {};  // no experts
  }
  return {};
}

// Llama: Hugging Face's LlamaForCausalLM names exactly; q, k, v and gate, up are separate
// tensors there, kept adjacent here. A sparse block's experts are named as in Hugging Face's
// MixtralForCausalLM (w1 the gate, w3 the up, w2 the down projection of each expert), its
// shared experts as DeepSeek's (one SwiGLU "mlp.shared_experts").
std::vector<std::string> llama_names(const Architecture& a, ParamRole r, int layer) {
  const std::string h = "model.layers." + std::to_string(layer) + ".";
  if (a.sparse_block(layer)) {
    const std::string moe = h + "block_sparse_moe.";
    std::vector<std::string> names;
    switch (r) {
      case ParamRole::mlp_up:
        if (a.n_shared_experts == 0) return {};
        return {h + "mlp.shared_experts.gate_proj.weight", h + "mlp.shared_experts.up_proj.weight"};
      case ParamRole::mlp_down:
        if (a.n_shared_experts == 0) return {};
        return {h + "mlp.shared_experts.down_proj.weight"};
      case ParamRole::moe_router: return {moe + "gate.weight"};
      case ParamRole::expert_up:
        for (int e = 0; e < a.n_experts; e++) {
          const std::string x = moe + "experts." + std::to_string(e) + ".";
          names.push_back(x + "w1.weight");
          names.push_back(x + "w3.weight");
        }
        return names;
      case ParamRole::expert_down:
        for (int e = 0; e < a.n_experts; e++) names.push_back(moe + "experts." + std::to_string(e) + ".w2.weight");
        return names;
      default: break;  // the attention half is a dense block's
    }
  }
  switch (r) {
    case ParamRole::token_embedding: return {"model.embed_tokens.weight"};
    case ParamRole::norm1: return {h + "input_layernorm.weight"};
    case ParamRole::qkv:
      return {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"};
    case ParamRole::attn_out: return {h + "self_attn.o_proj.weight"};
    case ParamRole::norm2: return {h + "post_attention_layernorm.weight"};
    case ParamRole::mlp_up: return {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"};
    case ParamRole::mlp_down: return {h + "mlp.down_proj.weight"};
    case ParamRole::final_norm: return {"model.norm.weight"};
    case ParamRole::head: return {"lm_head.weight"};
    default: return {};  // no biases, no learned positions
  }
}

}  // namespace

std::vector<std::string> Architecture::tensor_names(ParamRole role, int layer) const {
  if (role == ParamRole::head && tied_head) return {};
  return name == "llama" ? llama_names(*this, role, layer) : gpt2_names(role, layer);
}

}  // namespace pt
