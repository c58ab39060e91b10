#include "core/model/gpt2_stage.h"

#include <numeric>

namespace pt {

Gpt2Stage::Gpt2Stage(const ModelSection& model, ParamStore& store, Ops& ops, int B, int T)
    : m_(model), store_(store), ops_(ops), B_(B), T_(T) {
  const size_t N = static_cast<size_t>(B) * T, C = m_.d_model, NH = m_.n_heads, Vp = m_.padded_vocab;
  const DType act = ops.compute_dtype();
  tokens_ = alloc_act(N, DType::i32);
  targets_ = alloc_act(N, DType::i32);
  pos_ = alloc_act(T, DType::i32);
  std::vector<int32_t> pos(T);
  std::iota(pos.begin(), pos.end(), 0);
  ops.upload(pos_, pos.data(), DType::i32, T);

  encoded_ = alloc_act(N * C, act);
  acts_.resize(m_.n_layers);
  for (auto& a : acts_) {
    a.ln1 = alloc_act(N * C, act);
    a.ln1_mean = alloc_act(N, DType::f32);
    a.ln1_rstd = alloc_act(N, DType::f32);
    a.qkv = alloc_act(N * 3 * C, act);
    a.atty = alloc_act(N * C, act);
    a.lse = alloc_act(static_cast<size_t>(B) * NH * T, DType::f32);
    a.attproj = alloc_act(N * C, act);
    a.res2 = alloc_act(N * C, act);
    a.ln2 = alloc_act(N * C, act);
    a.ln2_mean = alloc_act(N, DType::f32);
    a.ln2_rstd = alloc_act(N, DType::f32);
    a.fch = alloc_act(N * 4 * C, act);
    a.fch_gelu = alloc_act(N * 4 * C, act);
    a.fcproj = alloc_act(N * C, act);
    a.res3 = alloc_act(N * C, act);
  }
  lnf_ = alloc_act(N * C, act);
  lnf_mean_ = alloc_act(N, DType::f32);
  lnf_rstd_ = alloc_act(N, DType::f32);
  logits_ = alloc_act(N * Vp, act);
  losses_ = alloc_act(N, DType::f32);

  dres_ = alloc_act(N * C, act);
  dbtc_ = alloc_act(N * C, act);
  dqkv_ = alloc_act(N * 3 * C, act);
  dfch_ = alloc_act(N * 4 * C, act);
  dfch_gelu_ = alloc_act(N * 4 * C, act);
}

Gpt2Stage::~Gpt2Stage() {
  for (auto& t : owned_) ops_.release(t);
}

Tensor Gpt2Stage::alloc_act(size_t n, DType dtype) {
  Tensor t = ops_.alloc(n, dtype);
  owned_.push_back(t);
  activation_bytes_ += t.bytes();
  return t;
}

Gpt2Stage::LayerParams Gpt2Stage::layer_params(int l, bool grads) const {
  const std::string h = "h." + std::to_string(l) + ".";
  auto get = [&](const char* name) { return grads ? store_.grad(h + name) : store_.param(h + name); };
  return {get("ln_1.weight"),      get("ln_1.bias"),        get("attn.c_attn.weight"), get("attn.c_attn.bias"),
          get("attn.c_proj.weight"), get("attn.c_proj.bias"), get("ln_2.weight"),        get("ln_2.bias"),
          get("mlp.c_fc.weight"),  get("mlp.c_fc.bias"),    get("mlp.c_proj.weight"),  get("mlp.c_proj.bias")};
}

double Gpt2Stage::forward(const int32_t* tokens, const int32_t* targets, float dloss) {
  const int B = B_, T = T_, C = m_.d_model, NH = m_.n_heads, N = B * T;
  const int V = m_.vocab_size, Vp = m_.padded_vocab;
  ops_.upload(tokens_, tokens, DType::i32, N);
  ops_.upload(targets_, targets, DType::i32, N);
  const int embeddings = -1, final_norm = m_.n_layers;  // ParamSpec::layer of the non-block layers

  hooks_->acquire_params(embeddings);
  ops_.embedding_forward(encoded_, tokens_, store_.param("wte"), N, C, 0, Vp);
  ops_.position_forward(encoded_, store_.param("wpe"), pos_, B, T, C);
  hooks_->release_params(embeddings);

  Tensor x = encoded_;  // the residual stream entering each block
  for (int l = 0; l < m_.n_layers; l++) {
    hooks_->acquire_params(l);
    const LayerParams p = layer_params(l, false);
    LayerActs& a = acts_[l];
    ops_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b, N, C);
    ops_.matmul_forward(a.qkv, a.ln1, p.qkvw, p.qkvb, N, C, 3 * C);
    ops_.attention_forward(a.atty, a.lse, a.qkv, B, T, C, NH);
    ops_.matmul_forward(a.attproj, a.atty, p.projw, p.projb, N, C, C);
    ops_.add(a.res2, x, a.attproj, static_cast<size_t>(N) * C);
    ops_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, N, C);
    ops_.matmul_forward(a.fch, a.ln2, p.fcw, p.fcb, N, C, 4 * C);
    ops_.gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * 4 * C);
    ops_.matmul_forward(a.fcproj, a.fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
    ops_.add(a.res3, a.res2, a.fcproj, static_cast<size_t>(N) * C);
    hooks_->release_params(l);
    x = a.res3;
  }
  hooks_->acquire_params(final_norm);
  ops_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, store_.param("ln_f.weight"), store_.param("ln_f.bias"), N, C);
  // LM head tied to the token embedding: logits = lnf @ wte^T over the padded vocabulary.
  hooks_->acquire_params(embeddings);
  ops_.matmul_forward(logits_, lnf_, store_.param("wte"), Tensor{}, N, C, Vp);
  ops_.softmax_cross_entropy(losses_, logits_, targets_, N, V, Vp, dloss);
  have_grad_ = dloss != 0.0f;
  // Backward starts with the head and the final norm, so training keeps both; evaluation is done.
  if (!have_grad_) {
    hooks_->release_params(embeddings);
    hooks_->release_params(final_norm);
  }
  return ops_.sum(losses_, N);
}

void Gpt2Stage::backward() {
  check(have_grad_, "Gpt2Stage::backward called without a training forward pass");
  const int B = B_, T = T_, C = m_.d_model, NH = m_.n_heads, N = B * T, Vp = m_.padded_vocab;
  const size_t NC = static_cast<size_t>(N) * C;
  const int embeddings = -1, final_norm = m_.n_layers;

  // Head: logits now hold dlogits (written in place by the fused cross-entropy).
  hooks_->acquire_grads(embeddings);
  hooks_->acquire_grads(final_norm);
  ops_.zero(dbtc_);
  ops_.matmul_backward(dbtc_, store_.grad("wte"), Tensor{}, logits_, lnf_, store_.param("wte"), N, C, Vp);
  const Tensor x_last = m_.n_layers > 0 ? acts_.back().res3 : encoded_;
  ops_.zero(dres_);
  ops_.layernorm_backward(dres_, store_.grad("ln_f.weight"), store_.grad("ln_f.bias"), dbtc_, x_last,
                          store_.param("ln_f.weight"), lnf_mean_, lnf_rstd_, N, C);
  // The embedding backward below reads no parameter values, only the gradient.
  hooks_->release_params(final_norm);
  hooks_->release_params(embeddings);
  hooks_->grads_ready(final_norm);

  // dres_ holds d(loss)/d(residual stream) and flows down through every block: each residual
  // add passes it through unchanged, and the branch backward passes accumulate into it.
  for (int l = m_.n_layers - 1; l >= 0; l--) {
    hooks_->acquire_params(l);
    hooks_->acquire_grads(l);
    const LayerParams p = layer_params(l, false);
    const LayerParams g = layer_params(l, true);
    LayerActs& a = acts_[l];
    const Tensor x = l > 0 ? acts_[l - 1].res3 : encoded_;
    // MLP branch: res3 = res2 + fcproj(gelu(fc(ln2(res2))))
    ops_.zero(dfch_gelu_);
    ops_.matmul_backward(dfch_gelu_, g.fcprojw, g.fcprojb, dres_, a.fch_gelu, p.fcprojw, N, 4 * C, C);
    ops_.zero(dfch_);
    ops_.gelu_backward(dfch_, a.fch, dfch_gelu_, NC * 4);
    ops_.zero(dbtc_);
    ops_.matmul_backward(dbtc_, g.fcw, g.fcb, dfch_, a.ln2, p.fcw, N, C, 4 * C);
    ops_.layernorm_backward(dres_, g.ln2w, g.ln2b, dbtc_, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd, N, C);
    // Attention branch: res2 = x + proj(attention(qkv(ln1(x))))
    ops_.zero(dbtc_);
    ops_.matmul_backward(dbtc_, g.projw, g.projb, dres_, a.atty, p.projw, N, C, C);
    ops_.zero(dqkv_);
    ops_.attention_backward(dqkv_, dbtc_, a.qkv, a.atty, a.lse, B, T, C, NH);
    ops_.zero(dbtc_);
    ops_.matmul_backward(dbtc_, g.qkvw, g.qkvb, dqkv_, a.ln1, p.qkvw, N, C, 3 * C);
    ops_.layernorm_backward(dres_, g.ln1w, g.ln1b, dbtc_, x, p.ln1w, a.ln1_mean, a.ln1_rstd, N, C);
    hooks_->release_params(l);
    hooks_->grads_ready(l);
  }

  ops_.embedding_backward(store_.grad("wte"), dres_, tokens_, N, C, 0, Vp);
  ops_.position_backward(store_.grad("wpe"), dres_, pos_, B, T, C);
  hooks_->grads_ready(embeddings);
  have_grad_ = false;
}

}  // namespace pt
