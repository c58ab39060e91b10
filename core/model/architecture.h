// Architecture: the one description of a decoder-only transformer that the rest of picotrain
// reads. A block is always
//   x = x + attn_out(attention(rope?(qkv(norm1(x)))))
//   x = x + mlp_down(act(mlp_up(norm2(x))))
// between a token embedding (plus learned positions, or none with RoPE) and a final norm, an LM
// head and the loss. What varies between architectures is said here, once, as data: the norm
// (LayerNorm with a bias, or RMSNorm), whether matmuls have biases, the positions (learned or
// RoPE), the MLP's activation (GELU, or SwiGLU with a gate), grouped-query attention's K/V
// heads, whether the head is tied to the token embedding, and every tensor's name, shape, split
// and initialisation (build_param_table). The stage (core/model/decoder_stage.h), ZeRO, the
// checkpoints, the planner and the FLOPs formula read these fields and the tensors' roles; none
// of them names an architecture.
//
//   gpt2   OpenAI GPT-2 / llm.c exactly: LayerNorm (eps 1e-5) with bias, biases everywhere,
//          learned positions, GELU (tanh) 4x MLP, multi-head, tied head; names as Hugging
//          Face's GPT-2 ("h.0.attn.c_attn.weight"), q|k|v fused in one tensor, weights [out, in].
//   llama  Hugging Face's LlamaForCausalLM exactly: RMSNorm (norm_eps), no biases, RoPE
//          (rope_theta, rotate-half), SwiGLU, grouped-query attention, untied head by default;
//          Hugging Face's names ("model.layers.0.self_attn.q_proj.weight"), q, k, v and gate,
//          up as separate tensors laid out one after another so each group is one matmul.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "core/config/run_config.h"

namespace pt {

enum class NormKind { layernorm, rmsnorm };
enum class MlpKind { gelu, swiglu };
enum class PositionKind { learned, rope };

// What a parameter tensor is for. A role may be several tensors that lie one after another in
// the table (llama's q_proj, k_proj, v_proj are the role qkv; gate_proj, up_proj mlp_up), and so
// in every arena, tensor-parallel piece and ZeRO-3 layer buffer made from it: the stage runs a
// role as one matmul over the run of tensors. Biases are absent where the architecture has none.
enum class ParamRole {
  token_embedding,     // [padded_vocab, C], vocabulary-split; also the LM head when tied
  position_embedding,  // [max_seq_len, C] (learned positions only)
  norm1,
  norm1_bias,
  qkv,  // [(n_heads + 2 n_kv_heads) head_dim, C]: q rows, then k, then v
  qkv_bias,
  attn_out,  // [C, n_heads head_dim], row-split
  attn_out_bias,
  norm2,
  norm2_bias,
  mlp_up,  // [F, C] (gelu) or [2F, C]: gate rows, then up rows (swiglu)
  mlp_up_bias,
  mlp_down,  // [C, F], row-split
  mlp_down_bias,
  final_norm,
  final_norm_bias,
  head,  // [padded_vocab, C], vocabulary-split (untied heads only)
  // A sparse (mixture-of-experts) block's MLP: a router and n_experts SwiGLU experts, besides
  // mlp_up/mlp_down, which there are its shared experts (absent without them). Replicated over tp.
  moe_router,   // [n_experts, C]
  expert_up,    // n_experts x [2 expert_hidden, C]: each expert's gate rows, then its up rows
  expert_down,  // n_experts x [C, expert_hidden] (the last role: kParamRoles)
};
inline constexpr size_t kParamRoles = static_cast<size_t>(ParamRole::expert_down) + 1;
const char* to_string(ParamRole r);

struct Architecture {
  std::string name;  // model.arch, for messages, reports and exports
  NormKind norm = NormKind::layernorm;
  MlpKind mlp = MlpKind::gelu;
  PositionKind positions = PositionKind::learned;
  bool biases = true;
  bool tied_head = true;
  int n_layers = 0, d_model = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn_hidden = 0;
  int vocab_size = 0, padded_vocab = 0, max_seq_len = 0;
  float norm_eps = 1e-5f;
  float rope_theta = 0.0f;
  // GPT-2 initialises the two projections into the residual stream with std 0.02/sqrt(2 n_layers);
  // Hugging Face's Llama uses 0.02 for every matrix.
  bool scaled_residual_init = true;
  // Mixture of experts (Mixtral; the moe section): 0 experts is a dense model.
  int n_experts = 0, top_k = 0, expert_hidden = 0, moe_every = 1, n_shared_experts = 0;
  float aux_loss_coef = 0.0f;

  int q_width() const { return n_heads * head_dim; }
  int kv_width() const { return n_kv_heads * head_dim; }
  int qkv_width() const { return q_width() + 2 * kv_width(); }
  // Whether block `layer` is sparse: its MLP is routed experts (plus shared ones).
  bool sparse_block(int layer) const { return n_experts > 0 && (layer + 1) % moe_every == 0; }
  int sparse_blocks() const { return n_experts > 0 ? n_layers / moe_every : 0; }
  // The hidden width of block `layer`'s dense MLP: ffn_hidden, or in a sparse block its shared
  // experts' n_shared_experts x expert_hidden (0: none). The widest over the blocks sizes buffers.
  int mlp_hidden(int layer) const {
    return sparse_block(layer) ? n_shared_experts * expert_hidden : ffn_hidden;
  }
  int max_mlp_hidden() const;
  // The MLP's up-projection output: the hidden width, twice it with SwiGLU's gate.
  int up_width(int hidden) const { return mlp == MlpKind::swiglu ? 2 * hidden : hidden; }
  int mlp_up_width() const { return up_width(ffn_hidden); }
  bool norm_has_bias() const { return norm == NormKind::layernorm; }

  // The checkpoint names of the tensors that make up `role` in block `layer` (ignored outside
  // the blocks), one after another in the table; empty where the architecture has no such
  // tensor (biases, learned positions, an untied head).
  std::vector<std::string> tensor_names(ParamRole role, int layer) const;
};

// The architecture model.arch names, with the model's shape (the config's resolved keys; a
// ModelSection made in code gets each key's default through its accessors).
Architecture describe_architecture(const ModelSection& model);

}  // namespace pt
