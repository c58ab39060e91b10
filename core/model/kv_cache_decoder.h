// KvCacheDecoder: inference with a KV cache, for sampling, for every architecture
// (core/model/architecture.h: GPT-2, Llama). It runs the same block as DecoderStage
// (core/model/decoder_stage.h) through the same Ops, parameters found by role, but forward only,
// for one sequence, keeping each layer's keys and values ([max_seq_len, n_kv_heads * head_dim]
// per layer: grouped-query attention's cache is n_heads / n_kv_heads times smaller) so that a new
// token costs one row of every matmul and one query's attention over the cache instead of a
// forward over the whole context.
//
// One code path: extend() runs a chunk of n new tokens at positions [length, length + n) --
// per layer: the norm, the q, k and v projections of the n rows (k and v written straight into
// the cache rows they belong to), RoPE on the new q and k rows at their positions (Llama; the
// cached keys are stored rotated, as training's attention reads them), causal attention of the
// n queries over the cached keys 0 .. length + n - 1 (Ops::attention_block_forward, reading the
// shared K/V heads), projection, MLP (GELU, or SwiGLU over gate | up), residual adds -- then
// the final norm and the LM head (tied or not) on the last row only. A prompt is one chunk of
// many tokens; each sampled token is a chunk of one.
//
// Context longer than max_seq_len: GPT-2's position embedding has max_seq_len rows, and a
// RoPE model was trained on at most max_seq_len positions, so the model sees at most the last
// max_seq_len tokens, as nanoGPT's and llm.c's samplers do. Once the cache is full, a new token
// slides the window: the cache is rebuilt from the last max_seq_len tokens (whose positions
// have all moved by one, so no cached row stays valid), i.e. every token past max_seq_len costs
// a forward over max_seq_len tokens, and the logits are exactly those of a full forward over
// the window.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/config/run_config.h"
#include "core/model/architecture.h"
#include "core/model/moe_layer.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/ops/ops.h"

namespace pt {

class KvCacheDecoder {
 public:
  // Reads the weights of `store`, which must hold every parameter resident (one rank, or ZeRO
  // 0-2; not owned, must outlive the decoder and not change while it is used).
  KvCacheDecoder(const ModelSection& model, const ParamStore& store, Ops& ops);
  // Uploads `host_weights` (fp32, the table's total_numel values in table order, e.g. a
  // checkpoint's master weights) into one arena of the compute dtype that the decoder owns.
  KvCacheDecoder(const ModelSection& model, const float* host_weights, Ops& ops);
  ~KvCacheDecoder();
  KvCacheDecoder(const KvCacheDecoder&) = delete;
  KvCacheDecoder& operator=(const KvCacheDecoder&) = delete;

  // Starts over with `tokens` (at least one) as the context; only the last max_seq_len are
  // kept. Returns the logits of the next token, [vocab_size] (the real vocabulary).
  std::span<const float> prime(std::span<const int32_t> tokens);
  // Appends one token; returns the logits of the token after it.
  std::span<const float> push(int32_t token);
  // Tokens whose keys and values are in the cache (<= max_seq_len).
  int length() const { return length_; }
  const ModelSection& model() const { return m_; }

 private:
  // One block's weights by role (null where the architecture has none: biases, LayerNorm's
  // bias). q, k and v are row slices of the qkv role, so k and v land in the cache directly.
  struct LayerParams {
    Tensor norm1w, norm1b, qw, qb, kw, kb, vw, vb, outw, outb, norm2w, norm2b, upw, upb, downw, downb;
    MoeParams moe;  // a sparse block's router and routed experts
  };
  void allocate();
  // `role(r, layer)`: the tensor of role r in `layer` (-1: embeddings, n_layers: final norm, head).
  void resolve_params(const std::function<Tensor(ParamRole, int)>& role);
  // Runs n tokens at positions [length_, length_ + n) (length_ + n <= max_seq_len) and leaves the
  // logits of the last one in logits_.
  void extend(const int32_t* tokens, int n);
  // The architecture's norm of x's n rows (mean null for RMSNorm), and the residual add fused
  // with it.
  void norm(Tensor out, Tensor x, Tensor w, Tensor b, int n);
  void residual_norm(Tensor residual, Tensor out, Tensor a, Tensor b, Tensor w, Tensor bias, int n);
  Tensor alloc(size_t n, DType dtype);
  void check_token(int32_t token) const;

  ModelSection m_;
  Architecture arch_;
  Ops& ops_;
  std::unique_ptr<ParamTable> own_table_;  // with the owned weight arena
  std::vector<LayerParams> layers_;
  Tensor wte_, wpe_, final_normw_, final_normb_, head_;
  std::vector<Tensor> owned_;  // released in the destructor

  std::vector<Tensor> kcache_, vcache_;  // per layer, [max_seq_len, n_kv_heads * head_dim]
  // Activations of one chunk (up to max_seq_len rows).
  Tensor tokens_, pos_, x_, normed_, mean_, rstd_, q_, att_, lse_, proj_, up_, act_, logits_, moe_out_;
  std::unique_ptr<MoeLayer> moe_;  // the routed experts of every sparse block (one at a time)
  std::vector<float> host_logits_;
  std::vector<int32_t> window_;  // the last max_seq_len tokens (the cache's contents)
  int length_ = 0;
};

}  // namespace pt
