// Gpt2Decoder: GPT-2 inference with a KV cache, for sampling. It runs the same layers as
// DecoderStage (core/model/decoder_stage.h) through the same Ops, but forward only, for one sequence,
// keeping each layer's keys and values ([max_seq_len, C] per layer) so that a new token costs
// one row of every matmul and one query's attention over the cache instead of a forward over
// the whole context.
//
// One code path: extend() runs a chunk of n new tokens at positions [length, length + n) --
// per layer: LayerNorm, the q, k and v projections of the n rows (k and v written straight into
// the cache rows they belong to), causal attention of the n queries over the cached keys
// 0 .. length + n - 1 (Ops::attention_block_forward), projection, MLP, residual adds -- then the
// final LayerNorm and the tied LM head on the last row only. A prompt is one chunk of many
// tokens; each sampled token is a chunk of one.
//
// Context longer than max_seq_len: the position embedding has max_seq_len rows, so the model
// sees at most the last max_seq_len tokens, as nanoGPT's and llm.c's samplers do. Once the
// cache is full, a new token slides the window: the cache is rebuilt from the last max_seq_len
// tokens (whose positions have all moved by one, so no cached row stays valid), i.e. every token
// past max_seq_len costs a forward over max_seq_len tokens, and the logits are exactly those of
// a full forward over the window.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/config/run_config.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/ops/ops.h"

namespace pt {

class Gpt2Decoder {
 public:
  // Reads the weights of `store`, which must hold every parameter resident (one rank, or ZeRO
  // 0-2; not owned, must outlive the decoder and not change while it is used).
  Gpt2Decoder(const ModelSection& model, const ParamStore& store, Ops& ops);
  // Uploads `host_weights` (fp32, the table's total_numel values in table order, e.g. a
  // checkpoint's master weights) into one arena of the compute dtype that the decoder owns.
  Gpt2Decoder(const ModelSection& model, const float* host_weights, Ops& ops);
  ~Gpt2Decoder();
  Gpt2Decoder(const Gpt2Decoder&) = delete;
  Gpt2Decoder& operator=(const Gpt2Decoder&) = delete;

  // Starts over with `tokens` (at least one) as the context; only the last max_seq_len are
  // kept. Returns the logits of the next token, [vocab_size] (the real vocabulary).
  std::span<const float> prime(std::span<const int32_t> tokens);
  // Appends one token; returns the logits of the token after it.
  std::span<const float> push(int32_t token);
  // Tokens whose keys and values are in the cache (<= max_seq_len).
  int length() const { return length_; }
  const ModelSection& model() const { return m_; }

 private:
  struct LayerParams {
    Tensor ln1w, ln1b, qw, qb, kw, kb, vw, vb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  };
  void allocate();
  void resolve_params(const std::function<Tensor(const std::string&)>& param);
  // Runs n tokens at positions [length_, length_ + n) (length_ + n <= max_seq_len) and leaves the
  // logits of the last one in logits_.
  void extend(const int32_t* tokens, int n);
  Tensor alloc(size_t n, DType dtype);
  void check_token(int32_t token) const;

  ModelSection m_;
  Ops& ops_;
  std::unique_ptr<ParamTable> own_table_;  // with the owned weight arena
  std::vector<LayerParams> layers_;
  Tensor wte_, wpe_, lnfw_, lnfb_;
  std::vector<Tensor> owned_;  // released in the destructor

  std::vector<Tensor> kcache_, vcache_;  // per layer, [max_seq_len, C]
  // Activations of one chunk (up to max_seq_len rows).
  Tensor tokens_, pos_, x_, ln_, mean_, rstd_, q_, att_, lse_, proj_, fch_, fch_gelu_;
  Tensor lnf_, lnf_mean_, lnf_rstd_, logits_;
  std::vector<float> host_logits_;
  std::vector<int32_t> window_;  // the last max_seq_len tokens (the cache's contents)
  int length_ = 0;
};

}  // namespace pt
