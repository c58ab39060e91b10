#include "core/model/gpt2_decoder.h"

#include <algorithm>
#include <numeric>

namespace pt {


Gpt2Decoder::Gpt2Decoder(const ModelSection& model, const ParamStore& store, Ops& ops) : m_(model), ops_(ops) {
  check(store.layout().params_resident(),
        "Gpt2Decoder: the parameters are sharded (ZeRO-3); gather the master weights and use the other constructor");
  resolve_params([&](const std::string& name) { return store.param(name); });
  allocate();
}

Gpt2Decoder::Gpt2Decoder(const ModelSection& model, const float* host_weights, Ops& ops) : m_(model), ops_(ops) {
  own_table_ = std::make_unique<ParamTable>(build_param_table(model));
  const ParamTable& table = *own_table_;
  const Tensor arena = alloc(table.total_numel(), ops.compute_dtype());
  ops.upload(arena, host_weights, DType::f32, table.total_numel());
  resolve_params([&](const std::string& name) {
    const ParamSpec& p = table.get(name);
    return arena.slice(p.offset, p.numel);
  });
  allocate();
}

Gpt2Decoder::~Gpt2Decoder() {
  for (auto& t : owned_) ops_.release(t);
}

Tensor Gpt2Decoder::alloc(size_t n, DType dtype) {
  owned_.push_back(ops_.alloc(n, dtype));
  return owned_.back();
}

void Gpt2Decoder::resolve_params(const std::function<Tensor(const std::string&)>& param) {
  const size_t C = m_.d_model;
  wte_ = param("wte");
  wpe_ = param("wpe");
  lnfw_ = param("ln_f.weight");
  lnfb_ = param("ln_f.bias");
  layers_.resize(m_.n_layers);
  for (int l = 0; l < m_.n_layers; l++) {
    const std::string h = "h." + std::to_string(l) + ".";
    LayerParams& p = layers_[l];
    p.ln1w = param(h + "ln_1.weight");
    p.ln1b = param(h + "ln_1.bias");
    // c_attn is [3C, C] with the q, k and v rows one after another (and its bias likewise), so
    // each projection is a contiguous slice: k and v can be written straight into the cache.
    const Tensor qkvw = param(h + "attn.c_attn.weight"), qkvb = param(h + "attn.c_attn.bias");
    p.qw = qkvw.slice(0, C * C);
    p.kw = qkvw.slice(C * C, C * C);
    p.vw = qkvw.slice(2 * C * C, C * C);
    p.qb = qkvb.slice(0, C);
    p.kb = qkvb.slice(C, C);
    p.vb = qkvb.slice(2 * C, C);
    p.projw = param(h + "attn.c_proj.weight");
    p.projb = param(h + "attn.c_proj.bias");
    p.ln2w = param(h + "ln_2.weight");
    p.ln2b = param(h + "ln_2.bias");
    p.fcw = param(h + "mlp.c_fc.weight");
    p.fcb = param(h + "mlp.c_fc.bias");
    p.fcprojw = param(h + "mlp.c_proj.weight");
    p.fcprojb = param(h + "mlp.c_proj.bias");
  }
}

void Gpt2Decoder::allocate() {
  const size_t T = m_.max_seq_len, C = m_.d_model, NH = m_.n_heads;
  const DType act = ops_.compute_dtype();
  for (int l = 0; l < m_.n_layers; l++) {
    kcache_.push_back(alloc(T * C, act));
    vcache_.push_back(alloc(T * C, act));
  }
  tokens_ = alloc(T, DType::i32);
  pos_ = alloc(T, DType::i32);
  x_ = alloc(T * C, act);
  ln_ = alloc(T * C, act);
  mean_ = alloc(T, DType::f32);
  rstd_ = alloc(T, DType::f32);
  q_ = alloc(T * C, act);
  att_ = alloc(T * C, act);
  lse_ = alloc(NH * T, DType::f32);
  proj_ = alloc(T * C, act);
  fch_ = alloc(T * 4 * C, act);
  fch_gelu_ = alloc(T * 4 * C, act);
  lnf_ = alloc(C, act);
  lnf_mean_ = alloc(1, DType::f32);
  lnf_rstd_ = alloc(1, DType::f32);
  logits_ = alloc(static_cast<size_t>(m_.padded_vocab), act);
  host_logits_.resize(m_.vocab_size);
}

std::span<const float> Gpt2Decoder::prime(std::span<const int32_t> tokens) {
  check(!tokens.empty(), "Gpt2Decoder::prime: the context is empty (a prompt needs at least one token)");
  const size_t keep = std::min(tokens.size(), static_cast<size_t>(m_.max_seq_len));
  window_.assign(tokens.end() - static_cast<std::ptrdiff_t>(keep), tokens.end());
  length_ = 0;
  extend(window_.data(), static_cast<int>(window_.size()));
  return host_logits_;
}

std::span<const float> Gpt2Decoder::push(int32_t token) {
  check(length_ > 0, "Gpt2Decoder::push before prime");
  check_token(token);  // before the window changes
  if (length_ < m_.max_seq_len) {
    window_.push_back(token);
    extend(&token, 1);
    return host_logits_;
  }
  // The window slides: every kept token moves one position down, so the cache is rebuilt.
  window_.erase(window_.begin());
  window_.push_back(token);
  length_ = 0;
  extend(window_.data(), static_cast<int>(window_.size()));
  return host_logits_;
}

void Gpt2Decoder::check_token(int32_t token) const {
  check(token >= 0 && token < m_.vocab_size, "Gpt2Decoder: token id " + std::to_string(token) +
                                                 " is outside the model's vocabulary [0, " +
                                                 std::to_string(m_.vocab_size) + ")");
}

void Gpt2Decoder::extend(const int32_t* tokens, int n) {
  const int C = m_.d_model, NH = m_.n_heads, Vp = m_.padded_vocab, V = m_.vocab_size;
  const int p0 = length_, Tk = length_ + n;  // the chunk's first position; keys after it
  check(n >= 1 && Tk <= m_.max_seq_len, "Gpt2Decoder::extend: positions beyond max_seq_len");
  for (int i = 0; i < n; i++) check_token(tokens[i]);
  const size_t nC = static_cast<size_t>(n) * C;
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), p0);
  ops_.upload(tokens_, tokens, DType::i32, n);
  ops_.upload(pos_, pos.data(), DType::i32, n);

  const Tensor x = x_.slice(0, nC), ln = ln_.slice(0, nC), q = q_.slice(0, nC), att = att_.slice(0, nC),
               proj = proj_.slice(0, nC), fch = fch_.slice(0, 4 * nC), fch_gelu = fch_gelu_.slice(0, 4 * nC);
  const Tensor mean = mean_.slice(0, n), rstd = rstd_.slice(0, n), lse = lse_.slice(0, static_cast<size_t>(NH) * n);
  ops_.embedding_forward(x, tokens_, wte_, n, C, 0, Vp);
  ops_.position_forward(x, wpe_, pos_, 1, n, C);
  // x is the residual stream. Each residual add is fused with the LayerNorm after it (ln_2, the
  // next layer's ln_1), bit for bit the add and the norm, as in training (decoder_stage.cpp).
  ops_.layernorm_forward(ln, mean, rstd, x, layers_[0].ln1w, layers_[0].ln1b, n, C);
  for (int l = 0; l < m_.n_layers; l++) {
    const LayerParams& p = layers_[l];
    const Tensor k_new = kcache_[l].slice(static_cast<size_t>(p0) * C, nC);
    const Tensor v_new = vcache_[l].slice(static_cast<size_t>(p0) * C, nC);
    const Tensor k_all = kcache_[l].slice(0, static_cast<size_t>(Tk) * C);
    const Tensor v_all = vcache_[l].slice(0, static_cast<size_t>(Tk) * C);
    ops_.matmul_forward(q, ln, p.qw, p.qb, n, C, C);
    ops_.matmul_forward(k_new, ln, p.kw, p.kb, n, C, C);
    ops_.matmul_forward(v_new, ln, p.vw, p.vb, n, C, C);
    // Query i sits at position p0 + i and sees the keys at positions 0 .. p0 + i.
    ops_.attention_block_forward(att, lse, q, k_all, v_all, 1, n, Tk, C, NH, NH, p0, 0, true);  // GPT-2: MHA
    ops_.matmul_forward(proj, att, p.projw, p.projb, n, C, C);
    ops_.residual_layernorm_forward(x, ln, mean, rstd, x, proj, p.ln2w, p.ln2b, n, C);
    ops_.matmul_forward(fch, ln, p.fcw, p.fcb, n, C, 4 * C);
    ops_.gelu_forward(fch_gelu, fch, 4 * nC);
    ops_.matmul_forward(proj, fch_gelu, p.fcprojw, p.fcprojb, n, 4 * C, C);
    if (l + 1 < m_.n_layers) {
      const LayerParams& next = layers_[l + 1];
      ops_.residual_layernorm_forward(x, ln, mean, rstd, x, proj, next.ln1w, next.ln1b, n, C);
    } else {
      ops_.add(x, x, proj, nC);  // ln_f below normalises the last row only
    }
  }
  length_ = Tk;
  // Only the last row's next-token distribution is wanted: the final norm and the LM head (tied
  // to the token embedding) run on that row alone.
  ops_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x.slice(static_cast<size_t>(n - 1) * C, C), lnfw_, lnfb_, 1, C);
  ops_.matmul_forward(logits_, lnf_, wte_, Tensor{}, 1, C, Vp);
  ops_.download(host_logits_.data(), DType::f32, logits_, static_cast<size_t>(V));
}

}  // namespace pt
