#include "core/model/kv_cache_decoder.h"

#include <algorithm>
#include <numeric>

namespace pt {

KvCacheDecoder::KvCacheDecoder(const ModelSection& model, const ParamStore& store, Ops& ops)
    : m_(model), arch_(describe_architecture(model)), ops_(ops) {
  check(store.layout().params_resident(),
        "KvCacheDecoder: the parameters are sharded (ZeRO-3); gather the master weights and use the other constructor");
  resolve_params([&](ParamRole r, int layer) { return store.role_param(r, layer); });
  allocate();
}

KvCacheDecoder::KvCacheDecoder(const ModelSection& model, const float* host_weights, Ops& ops)
    : m_(model), arch_(describe_architecture(model)), ops_(ops) {
  own_table_ = std::make_unique<ParamTable>(build_param_table(model));
  const ParamTable& table = *own_table_;
  const Tensor arena = alloc(table.total_numel(), ops.compute_dtype());
  ops.upload(arena, host_weights, DType::f32, table.total_numel());
  resolve_params([&](ParamRole r, int layer) {
    const RoleRun run = role_run(table, r, layer);
    return run ? arena.slice(run.first->offset, run.numel) : Tensor{};
  });
  allocate();
}

KvCacheDecoder::~KvCacheDecoder() {
  for (auto& t : owned_) ops_.release(t);
}

Tensor KvCacheDecoder::alloc(size_t n, DType dtype) {
  owned_.push_back(ops_.alloc(n, dtype));
  return owned_.back();
}

void KvCacheDecoder::resolve_params(const std::function<Tensor(ParamRole, int)>& role) {
  using R = ParamRole;
  const size_t C = arch_.d_model, QW = arch_.q_width(), KVW = arch_.kv_width();
  const int L = arch_.n_layers;
  wte_ = role(R::token_embedding, -1);
  wpe_ = role(R::position_embedding, -1);  // null with RoPE
  final_normw_ = role(R::final_norm, L);
  final_normb_ = role(R::final_norm_bias, L);
  head_ = arch_.tied_head ? wte_ : role(R::head, L);
  layers_.resize(L);
  for (int l = 0; l < L; l++) {
    LayerParams& p = layers_[l];
    p.norm1w = role(R::norm1, l);
    p.norm1b = role(R::norm1_bias, l);
    // The qkv role is [QW + 2 KVW, C]: the q rows, then k, then v (its bias likewise), so each
    // projection is a contiguous slice and k and v can be written straight into the cache.
    const Tensor qkvw = role(R::qkv, l), qkvb = role(R::qkv_bias, l);
    p.qw = qkvw.slice(0, QW * C);
    p.kw = qkvw.slice(QW * C, KVW * C);
    p.vw = qkvw.slice((QW + KVW) * C, KVW * C);
    if (qkvb) {
      p.qb = qkvb.slice(0, QW);
      p.kb = qkvb.slice(QW, KVW);
      p.vb = qkvb.slice(QW + KVW, KVW);
    }
    p.outw = role(R::attn_out, l);
    p.outb = role(R::attn_out_bias, l);
    p.norm2w = role(R::norm2, l);
    p.norm2b = role(R::norm2_bias, l);
    p.upw = role(R::mlp_up, l);
    p.upb = role(R::mlp_up_bias, l);
    p.downw = role(R::mlp_down, l);
    p.downb = role(R::mlp_down_bias, l);
    p.moe = {role(R::moe_router, l), role(R::expert_up, l), role(R::expert_down, l)};
  }
}

void KvCacheDecoder::allocate() {
  const size_t T = arch_.max_seq_len, C = arch_.d_model, NH = arch_.n_heads, QW = arch_.q_width(),
               KVW = arch_.kv_width(), F = arch_.max_mlp_hidden(), U = arch_.up_width(arch_.max_mlp_hidden());
  const DType act = ops_.compute_dtype();
  for (int l = 0; l < arch_.n_layers; l++) {
    kcache_.push_back(alloc(T * KVW, act));
    vcache_.push_back(alloc(T * KVW, act));
  }
  tokens_ = alloc(T, DType::i32);
  pos_ = alloc(T, DType::i32);
  x_ = alloc(T * C, act);
  normed_ = alloc(T * C, act);
  mean_ = alloc(T, DType::f32);
  rstd_ = alloc(T, DType::f32);
  q_ = alloc(T * QW, act);
  att_ = alloc(T * QW, act);
  lse_ = alloc(NH * T, DType::f32);
  proj_ = alloc(T * C, act);
  up_ = alloc(T * U, act);
  act_ = alloc(T * F, act);
  logits_ = alloc(static_cast<size_t>(arch_.padded_vocab), act);
  if (arch_.sparse_blocks() > 0) {
    // The routed experts' state is rebuilt by every block in turn: one slot, one layer.
    moe_ = std::make_unique<MoeLayer>(ops_, arch_, static_cast<int>(T), 1, 1, std::vector<Comm*>{}, nullptr,
                                      [this](size_t n, DType t) { return alloc(n, t); });
    moe_out_ = alloc(T * C, act);
  }
  host_logits_.resize(arch_.vocab_size);
}

std::span<const float> KvCacheDecoder::prime(std::span<const int32_t> tokens) {
  check(!tokens.empty(), "KvCacheDecoder::prime: the context is empty (a prompt needs at least one token)");
  const size_t keep = std::min(tokens.size(), static_cast<size_t>(m_.max_seq_len));
  window_.assign(tokens.end() - static_cast<std::ptrdiff_t>(keep), tokens.end());
  length_ = 0;
  extend(window_.data(), static_cast<int>(window_.size()));
  return host_logits_;
}

std::span<const float> KvCacheDecoder::push(int32_t token) {
  check(length_ > 0, "KvCacheDecoder::push before prime");
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

void KvCacheDecoder::check_token(int32_t token) const {
  check(token >= 0 && token < m_.vocab_size, "KvCacheDecoder: token id " + std::to_string(token) +
                                                 " is outside the model's vocabulary [0, " +
                                                 std::to_string(m_.vocab_size) + ")");
}

void KvCacheDecoder::norm(Tensor out, Tensor x, Tensor w, Tensor b, int n) {
  if (arch_.norm == NormKind::layernorm)
    return ops_.layernorm_forward(out, mean_.slice(0, n), rstd_.slice(0, n), x, w, b, n, arch_.d_model);
  ops_.rmsnorm_forward(out, rstd_.slice(0, n), x, w, n, arch_.d_model, arch_.norm_eps);
}

void KvCacheDecoder::residual_norm(Tensor residual, Tensor out, Tensor a, Tensor b, Tensor w, Tensor bias, int n) {
  const int C = arch_.d_model;
  if (arch_.norm == NormKind::layernorm)
    return ops_.residual_layernorm_forward(residual, out, mean_.slice(0, n), rstd_.slice(0, n), a, b, w, bias, n, C);
  ops_.residual_rmsnorm_forward(residual, out, rstd_.slice(0, n), a, b, w, n, C, arch_.norm_eps);
}

void KvCacheDecoder::extend(const int32_t* tokens, int n) {
  const Architecture& a = arch_;
  const int C = a.d_model, NH = a.n_heads, NKV = a.n_kv_heads, HS = a.head_dim, QW = a.q_width(),
            KVW = a.kv_width(), Vp = a.padded_vocab, V = a.vocab_size;
  const int p0 = length_, Tk = length_ + n;  // the chunk's first position; keys after it
  check(n >= 1 && Tk <= m_.max_seq_len, "KvCacheDecoder::extend: positions beyond max_seq_len");
  for (int i = 0; i < n; i++) check_token(tokens[i]);
  const size_t rows = static_cast<size_t>(n);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), p0);
  ops_.upload(tokens_, tokens, DType::i32, n);
  ops_.upload(pos_, pos.data(), DType::i32, n);

  const Tensor x = x_.slice(0, rows * C), normed = normed_.slice(0, rows * C), q = q_.slice(0, rows * QW),
               att = att_.slice(0, rows * QW), proj = proj_.slice(0, rows * C),
               lse = lse_.slice(0, static_cast<size_t>(NH) * n);
  ops_.embedding_forward(x, tokens_, wte_, n, C, 0, Vp);
  if (a.positions == PositionKind::learned) ops_.position_forward(x, wpe_, pos_, 1, n, C);
  // x is the residual stream. Each residual add is fused with the norm after it (norm 2, the
  // next layer's norm 1), bit for bit the add and the norm, as in training (decoder_stage.cpp).
  norm(normed, x, layers_[0].norm1w, layers_[0].norm1b, n);
  for (int l = 0; l < a.n_layers; l++) {
    const LayerParams& p = layers_[l];
    const Tensor k_new = kcache_[l].slice(static_cast<size_t>(p0) * KVW, rows * KVW);
    const Tensor v_new = vcache_[l].slice(static_cast<size_t>(p0) * KVW, rows * KVW);
    const Tensor k_all = kcache_[l].slice(0, static_cast<size_t>(Tk) * KVW);
    const Tensor v_all = vcache_[l].slice(0, static_cast<size_t>(Tk) * KVW);
    ops_.matmul_forward(q, normed, p.qw, p.qb, n, C, QW);
    ops_.matmul_forward(k_new, normed, p.kw, p.kb, n, C, KVW);
    ops_.matmul_forward(v_new, normed, p.vw, p.vb, n, C, KVW);
    if (a.positions == PositionKind::rope) {
      // The new rows at their positions; the cache keeps keys rotated, as training's attention reads them.
      ops_.rope_forward(q, pos_, 1, n, QW, NH, HS, a.rope_theta);
      ops_.rope_forward(k_new, pos_, 1, n, KVW, NKV, HS, a.rope_theta);
    }
    // Query i sits at position p0 + i and sees the keys at positions 0 .. p0 + i.
    ops_.attention_block_forward(att, lse, q, k_all, v_all, 1, n, Tk, QW, NH, NKV, p0, 0, true);
    ops_.matmul_forward(proj, att, p.outw, p.outb, n, QW, C);
    residual_norm(x, normed, x, proj, p.norm2w, p.norm2b, n);
    // The MLP: dense (a sparse block's shared experts, if any) plus a sparse block's routed experts.
    const int F = a.mlp_hidden(l), U = a.up_width(F);
    if (F > 0) {
      const Tensor up = up_.slice(0, rows * U), act = act_.slice(0, rows * F);
      ops_.matmul_forward(up, normed, p.upw, p.upb, n, C, U);
      if (a.mlp == MlpKind::gelu)
        ops_.gelu_forward(act, up, rows * F);
      else
        ops_.swiglu_forward(act, up, n, F);
      ops_.matmul_forward(proj, act, p.downw, p.downb, n, F, C);
    }
    if (a.sparse_block(l)) {
      const Tensor routed = F > 0 ? moe_out_.slice(0, rows * C) : proj;
      moe_->forward(0, 0, routed, normed, n, p.moe, 0.0f, false);
      if (F > 0) ops_.add(proj, proj, routed, rows * C);
    }
    if (l + 1 < a.n_layers) {
      const LayerParams& next = layers_[l + 1];
      residual_norm(x, normed, x, proj, next.norm1w, next.norm1b, n);
    } else {
      ops_.add(x, x, proj, rows * C);  // the final norm below normalises the last row only
    }
  }
  length_ = Tk;
  // Only the last row's next-token distribution is wanted: the final norm and the LM head run
  // on that row alone.
  const Tensor last = normed.slice(0, C);
  norm(last, x.slice(static_cast<size_t>(n - 1) * C, C), final_normw_, final_normb_, 1);
  ops_.matmul_forward(logits_, last, head_, Tensor{}, 1, C, Vp);
  ops_.download(host_logits_.data(), DType::f32, logits_, static_cast<size_t>(V));
}

}  // namespace pt
