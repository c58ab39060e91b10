#include "core/model/gpt2_stage.h"

#include <numeric>

namespace pt {

Recompute parse_recompute(std::string_view mode) {
  if (mode == "none") return Recompute::none;
  if (mode == "selective") return Recompute::selective;
  if (mode == "full") return Recompute::full;
  throw ConfigError("recompute.mode=\"" + std::string(mode) + "\" must be one of none, selective, full");
}

const char* to_string(Recompute mode) {
  switch (mode) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

Gpt2Stage::Gpt2Stage(const ModelSection& model, ParamStore& store, Ops& ops, int B, int T)
    : Gpt2Stage(model, store, ops, B, T, whole_model_layers(model), StageSlots{}, Recompute::none) {}

Gpt2Stage::Gpt2Stage(const ModelSection& model, ParamStore& store, Ops& ops, int B, int T, const StageLayers& layers,
                     StageSlots slots, Recompute recompute)
    : m_(model), store_(store), ops_(ops), B_(B), T_(T), layers_(layers), recompute_(recompute) {
  check(layers.first_layer >= 0 && layers.first_layer < layers.end_layer && layers.end_layer <= model.n_layers,
        "Gpt2Stage: the blocks [" + std::to_string(layers.first_layer) + ", " + std::to_string(layers.end_layer) +
            ") are not a non-empty range of the model's " + std::to_string(model.n_layers));
  check(slots.io >= 1 && slots.activations >= 1, "Gpt2Stage: at least one slot of each kind");
  const size_t N = static_cast<size_t>(B) * T, C = m_.d_model, NH = m_.n_heads, Vp = m_.padded_vocab;
  const size_t NC = N * C, lse_n = static_cast<size_t>(B) * NH * T;
  const DType act = ops.compute_dtype(), f32 = DType::f32;
  const int L = layers.layers();

  // Per slot, per block: what the recompute mode keeps. The last block's output is output_.
  const bool none = recompute == Recompute::none, selective = recompute == Recompute::selective;
  io_.resize(static_cast<size_t>(slots.io));
  for (IoSlot& s : io_) {
    s.input = alloc_act(NC, act);
    s.dres = alloc_act(NC, act);
  }
  // The buffers selective recompute rebuilds (LayerNorm outputs and stats, attention output and
  // lse, GELU output), and the matmul inputs only full recompute rebuilds. A slot keeps what its
  // mode does not rebuild; the shared set holds the rest, written again in backward.
  auto alloc_selective_buffers = [&](LayerActs& a) {
    a.ln1 = alloc_act(NC, act);
    a.ln1_mean = alloc_act(N, f32);
    a.ln1_rstd = alloc_act(N, f32);
    a.atty = alloc_act(NC, act);
    a.lse = alloc_act(lse_n, f32);
    a.ln2 = alloc_act(NC, act);
    a.ln2_mean = alloc_act(N, f32);
    a.ln2_rstd = alloc_act(N, f32);
    a.fch_gelu = alloc_act(4 * NC, act);
  };
  auto alloc_matmul_inputs = [&](LayerActs& a) {
    a.qkv = alloc_act(3 * NC, act);
    a.res2 = alloc_act(NC, act);
    a.fch = alloc_act(4 * NC, act);
  };
  acts_.resize(static_cast<size_t>(slots.activations));
  for (ActSlot& s : acts_) {
    if (layers.embedding) s.tokens = alloc_act(N, DType::i32);
    s.kept.resize(static_cast<size_t>(L));
    for (int i = 0; i < L; i++) {
      LayerActs& a = s.kept[static_cast<size_t>(i)];
      if (none) alloc_selective_buffers(a);
      if (none || selective) alloc_matmul_inputs(a);
      if (i + 1 < L) a.res3 = alloc_act(NC, act);
    }
  }
  // The shared set: what no slot keeps, and the two projections (read only by their residual add).
  LayerActs& sh = shared_;
  sh.attproj = alloc_act(NC, act);
  sh.fcproj = alloc_act(NC, act);
  if (!none) alloc_selective_buffers(sh);
  if (recompute == Recompute::full) alloc_matmul_inputs(sh);
  output_ = alloc_act(NC, act);

  if (layers.embedding) {
    pos_ = alloc_act(T, DType::i32);
    std::vector<int32_t> pos(T);
    std::iota(pos.begin(), pos.end(), 0);
    ops.upload(pos_, pos.data(), DType::i32, T);
  }
  if (layers.head) {
    targets_ = alloc_act(N, DType::i32);
    lnf_ = alloc_act(NC, act);
    lnf_mean_ = alloc_act(N, f32);
    lnf_rstd_ = alloc_act(N, f32);
    logits_ = alloc_act(N * Vp, act);
    losses_ = alloc_act(N, f32);
  }
  dbtc_ = alloc_act(NC, act);
  dqkv_ = alloc_act(3 * NC, act);
  dfch_ = alloc_act(4 * NC, act);
  dfch_gelu_ = alloc_act(4 * NC, act);
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

void Gpt2Stage::check_slots(MicroSlot at) const {
  check(at.activations >= 0 && at.activations < static_cast<int>(acts_.size()),
        "Gpt2Stage: activation slot " + std::to_string(at.activations) + " of " + std::to_string(acts_.size()));
  io(at.io);
}

const Gpt2Stage::IoSlot& Gpt2Stage::io(int io_slot) const {
  check(io_slot >= 0 && io_slot < static_cast<int>(io_.size()),
        "Gpt2Stage: I/O slot " + std::to_string(io_slot) + " of " + std::to_string(io_.size()));
  return io_[static_cast<size_t>(io_slot)];
}

Tensor Gpt2Stage::input(int io_slot) const {
  check(!layers_.embedding, "Gpt2Stage: the first stage computes its input from tokens");
  return io(io_slot).input;
}

Tensor Gpt2Stage::output() const {
  check(!layers_.head, "Gpt2Stage: the last stage ends in the loss, not an activation");
  return output_;
}

Tensor Gpt2Stage::grad_output(int io_slot) const {
  check(!layers_.head, "Gpt2Stage: the last stage's gradient comes from its loss");
  return io(io_slot).dres;
}

Tensor Gpt2Stage::grad_input(int io_slot) const {
  check(!layers_.embedding, "Gpt2Stage: the first stage sends no gradient back");
  return io(io_slot).dres;
}

Gpt2Stage::LayerParams Gpt2Stage::layer_params(int l, bool grads) const {
  const std::string h = "h." + std::to_string(l) + ".";
  auto get = [&](const char* name) { return grads ? store_.grad(h + name) : store_.param(h + name); };
  return {get("ln_1.weight"),      get("ln_1.bias"),        get("attn.c_attn.weight"), get("attn.c_attn.bias"),
          get("attn.c_proj.weight"), get("attn.c_proj.bias"), get("ln_2.weight"),        get("ln_2.bias"),
          get("mlp.c_fc.weight"),  get("mlp.c_fc.bias"),    get("mlp.c_proj.weight"),  get("mlp.c_proj.bias")};
}

Gpt2Stage::LayerActs Gpt2Stage::buffers(const ActSlot& s, int l) const {
  LayerActs a = s.kept[static_cast<size_t>(l - layers_.first_layer)];
  const LayerActs& sh = shared_;
  auto fill = [](Tensor& t, Tensor from) {
    if (!t) t = from;
  };
  fill(a.ln1, sh.ln1), fill(a.ln1_mean, sh.ln1_mean), fill(a.ln1_rstd, sh.ln1_rstd), fill(a.qkv, sh.qkv);
  fill(a.atty, sh.atty), fill(a.lse, sh.lse), fill(a.attproj, sh.attproj), fill(a.res2, sh.res2);
  fill(a.ln2, sh.ln2), fill(a.ln2_mean, sh.ln2_mean), fill(a.ln2_rstd, sh.ln2_rstd), fill(a.fch, sh.fch);
  fill(a.fch_gelu, sh.fch_gelu), fill(a.fcproj, sh.fcproj), fill(a.res3, output_);
  return a;
}

Tensor Gpt2Stage::block_input(const IoSlot& io, const ActSlot& s, int l) const {
  return l == layers_.first_layer ? io.input : s.kept[static_cast<size_t>(l - 1 - layers_.first_layer)].res3;
}

void Gpt2Stage::block_forward(const LayerActs& a, const LayerParams& p, Tensor x, bool to_gelu) {
  const int B = B_, T = T_, C = m_.d_model, NH = m_.n_heads, N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  ops_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b, N, C);
  ops_.matmul_forward(a.qkv, a.ln1, p.qkvw, p.qkvb, N, C, 3 * C);
  ops_.attention_forward(a.atty, a.lse, a.qkv, B, T, C, NH);
  ops_.matmul_forward(a.attproj, a.atty, p.projw, p.projb, N, C, C);
  ops_.add(a.res2, x, a.attproj, NC);
  ops_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, N, C);
  ops_.matmul_forward(a.fch, a.ln2, p.fcw, p.fcb, N, C, 4 * C);
  ops_.gelu_forward(a.fch_gelu, a.fch, NC * 4);
  if (to_gelu) return;  // backward needs nothing after the GELU
  ops_.matmul_forward(a.fcproj, a.fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
  ops_.add(a.res3, a.res2, a.fcproj, NC);
}

void Gpt2Stage::recompute_block(const LayerActs& a, const LayerParams& p, Tensor x) {
  const int B = B_, T = T_, C = m_.d_model, NH = m_.n_heads, N = B * T;
  switch (recompute_) {
    case Recompute::none: return;
    case Recompute::full: return block_forward(a, p, x, true);
    case Recompute::selective:
      // From the kept qkv, res2 and fch: the LayerNorm outputs, the attention output and its
      // log-sum-exps, the GELU output. Same kernels, same inputs: the same bits as forward's.
      ops_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b, N, C);
      ops_.attention_forward(a.atty, a.lse, a.qkv, B, T, C, NH);
      ops_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, N, C);
      ops_.gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * 4 * C);
      return;
  }
}

double Gpt2Stage::forward(MicroSlot at, const int32_t* tokens, const int32_t* targets, float dloss) {
  check_slots(at);
  ActSlot& s = acts_[static_cast<size_t>(at.activations)];
  const IoSlot& in = io_[static_cast<size_t>(at.io)];
  check(!s.backward_due, "Gpt2Stage: activation slot " + std::to_string(at.activations) +
                             " still holds a micro-batch whose backward has not run");
  const int B = B_, T = T_, C = m_.d_model, N = B * T;
  const int V = m_.vocab_size, Vp = m_.padded_vocab;
  const int embeddings = -1, final_norm = m_.n_layers;  // ParamSpec::layer of the non-block layers

  if (layers_.embedding) {
    ops_.upload(s.tokens, tokens, DType::i32, N);
    hooks_->acquire_params(embeddings);
    ops_.embedding_forward(in.input, s.tokens, store_.param("wte"), N, C, 0, Vp);
    ops_.position_forward(in.input, store_.param("wpe"), pos_, B, T, C);
    hooks_->release_params(embeddings);
  }

  Tensor x = in.input;  // the residual stream entering each block
  for (int l = layers_.first_layer; l < layers_.end_layer; l++) {
    hooks_->acquire_params(l);
    const LayerActs a = buffers(s, l);
    block_forward(a, layer_params(l, false), x, false);
    hooks_->release_params(l);
    x = a.res3;
  }
  s.backward_due = dloss != 0.0f;
  if (!layers_.head) return 0.0;

  ops_.upload(targets_, targets, DType::i32, N);
  hooks_->acquire_params(final_norm);
  ops_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, store_.param("ln_f.weight"), store_.param("ln_f.bias"), N, C);
  // LM head tied to the token embedding: logits = lnf @ wte^T over the padded vocabulary.
  hooks_->acquire_params(embeddings);
  ops_.matmul_forward(logits_, lnf_, store_.param("wte"), Tensor{}, N, C, Vp);
  ops_.softmax_cross_entropy(losses_, logits_, targets_, N, V, Vp, dloss);
  if (s.backward_due) {
    // The head's backward now, while the logits (now their gradient) are at hand: only the
    // gradient of the last block's output is kept for backward(slot).
    hooks_->acquire_grads(embeddings);
    hooks_->acquire_grads(final_norm);
    ops_.zero(dbtc_);
    ops_.matmul_backward(dbtc_, store_.grad("wte"), Tensor{}, logits_, lnf_, store_.param("wte"), N, C, Vp);
    ops_.zero(in.dres);
    ops_.layernorm_backward(in.dres, store_.grad("ln_f.weight"), store_.grad("ln_f.bias"), dbtc_, x,
                            store_.param("ln_f.weight"), lnf_mean_, lnf_rstd_, N, C);
  }
  hooks_->release_params(embeddings);
  hooks_->release_params(final_norm);
  if (s.backward_due) {
    hooks_->grads_ready(final_norm);
    // A head without the embedding holds the tied copy of wte: final for this micro-batch.
    if (!layers_.embedding) hooks_->grads_ready(embeddings);
  }
  return ops_.sum(losses_, N);
}

void Gpt2Stage::backward(MicroSlot at) {
  check_slots(at);
  ActSlot& s = acts_[static_cast<size_t>(at.activations)];
  const IoSlot& in = io_[static_cast<size_t>(at.io)];
  check(s.backward_due, "Gpt2Stage::backward of activation slot " + std::to_string(at.activations) +
                            " without a training forward pass");
  const int B = B_, T = T_, C = m_.d_model, NH = m_.n_heads, N = B * T, Vp = m_.padded_vocab;
  const size_t NC = static_cast<size_t>(N) * C;
  const int embeddings = -1;

  // in.dres holds d(loss)/d(residual stream) and flows down through every block: each residual
  // add passes it through unchanged, and the branch backward passes accumulate into it.
  const Tensor dres = in.dres;
  for (int l = layers_.end_layer - 1; l >= layers_.first_layer; l--) {
    hooks_->acquire_params(l);
    hooks_->acquire_grads(l);
    const LayerParams p = layer_params(l, false);
    const LayerParams g = layer_params(l, true);
    const LayerActs a = buffers(s, l);
    const Tensor x = block_input(in, s, l);
    recompute_block(a, p, x);
    // MLP branch: res3 = res2 + fcproj(gelu(fc(ln2(res2))))
    ops_.zero(dfch_gelu_);
    ops_.matmul_backward(dfch_gelu_, g.fcprojw, g.fcprojb, dres, a.fch_gelu, p.fcprojw, N, 4 * C, C);
    ops_.zero(dfch_);
    ops_.gelu_backward(dfch_, a.fch, dfch_gelu_, NC * 4);
    ops_.zero(dbtc_);
    ops_.matmul_backward(dbtc_, g.fcw, g.fcb, dfch_, a.ln2, p.fcw, N, C, 4 * C);
    ops_.layernorm_backward(dres, g.ln2w, g.ln2b, dbtc_, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd, N, C);
    // Attention branch: res2 = x + proj(attention(qkv(ln1(x))))
    ops_.zero(dbtc_);
    ops_.matmul_backward(dbtc_, g.projw, g.projb, dres, a.atty, p.projw, N, C, C);
    ops_.zero(dqkv_);
    ops_.attention_backward(dqkv_, dbtc_, a.qkv, a.atty, a.lse, B, T, C, NH);
    ops_.zero(dbtc_);
    ops_.matmul_backward(dbtc_, g.qkvw, g.qkvb, dqkv_, a.ln1, p.qkvw, N, C, 3 * C);
    ops_.layernorm_backward(dres, g.ln1w, g.ln1b, dbtc_, x, p.ln1w, a.ln1_mean, a.ln1_rstd, N, C);
    hooks_->release_params(l);
    hooks_->grads_ready(l);
  }

  if (layers_.embedding) {
    // The embedding backward reads no parameter values, only the gradient.
    hooks_->acquire_grads(embeddings);
    ops_.embedding_backward(store_.grad("wte"), dres, s.tokens, N, C, 0, Vp);
    ops_.position_backward(store_.grad("wpe"), dres, pos_, B, T, C);
    hooks_->grads_ready(embeddings);
  }
  s.backward_due = false;
}

}  // namespace pt
