// Gpt2Stage: the layers one pipeline rank owns, run through the Ops interface. On one rank
// (this issue) that is the whole model: token + position embedding, n_layers pre-LN blocks
// (causal attention, 4x GELU MLP), final LayerNorm, LM head tied to the token embedding, and
// the fused softmax cross-entropy over the real (unpadded) vocabulary.
//
// Forward keeps every activation backward needs for one micro-batch (activation recompute
// comes later); backward accumulates parameter gradients into the ParamStore. Around each layer
// it calls the LayerHooks (core/model/layer_hooks.h), through which ZeRO gathers parameters and
// reduces gradients layer by layer.
#pragma once
#include <cstdint>
#include <vector>

#include "core/config/run_config.h"
#include "core/model/layer_hooks.h"
#include "core/model/param_store.h"
#include "core/ops/ops.h"

namespace pt {

class Gpt2Stage {
 public:
  // B x T is the micro-batch shape every forward/backward uses.
  Gpt2Stage(const ModelSection& model, ParamStore& store, Ops& ops, int B, int T);
  ~Gpt2Stage();
  Gpt2Stage(const Gpt2Stage&) = delete;
  Gpt2Stage& operator=(const Gpt2Stage&) = delete;

  // Runs the forward pass on host token ids (B*T each; targets < 0 are ignored) and returns
  // the SUM of the per-token losses. With dloss != 0 the loss gradient (dloss per token) is
  // prepared for backward(); with dloss == 0 (evaluation) backward() must not be called.
  double forward(const int32_t* tokens, const int32_t* targets, float dloss);
  // Backpropagates the last forward, accumulating into the parameter gradients.
  void backward();
  // The data-parallel runtime's hooks (not owned; nullptr: everything is resident).
  void set_hooks(LayerHooks* hooks) { hooks_ = hooks ? hooks : &no_hooks_; }

  // Logits of the last forward, [B*T, padded_vocab] (valid when it ran with dloss == 0).
  Tensor logits() const { return logits_; }
  // Bytes of activation memory allocated for one micro-batch.
  size_t activation_bytes() const { return activation_bytes_; }

 private:
  struct LayerActs {
    Tensor ln1, ln1_mean, ln1_rstd, qkv, atty, lse, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj,
        res3;
  };
  struct LayerParams {
    Tensor ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  };
  LayerParams layer_params(int l, bool grads) const;
  Tensor alloc_act(size_t n, DType dtype);

  ModelSection m_;
  ParamStore& store_;
  LayerHooks no_hooks_;
  LayerHooks* hooks_ = &no_hooks_;
  Ops& ops_;
  int B_, T_;
  size_t activation_bytes_ = 0;
  std::vector<Tensor> owned_;  // every buffer below, released in the destructor

  Tensor tokens_, targets_, pos_;
  Tensor encoded_;
  std::vector<LayerActs> acts_;
  Tensor lnf_, lnf_mean_, lnf_rstd_, logits_, losses_;
  // backward scratch
  Tensor dres_, dbtc_, dqkv_, dfch_, dfch_gelu_;
  bool have_grad_ = false;
};

}  // namespace pt
