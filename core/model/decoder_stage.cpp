#include "core/model/decoder_stage.h"

#include <algorithm>

#include "core/dist/local_comm.h"
#include "core/model/head_chunks.h"
#include "core/parallel/cp_attention.h"
#include "core/parallel/tensor_parallel.h"
#include "core/parallel/vocab_parallel_ce.h"
#include "core/parallel/zigzag.h"
#include "core/train/memory_plan.h"

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

DecoderStage::DecoderStage(const ModelSection& model, ParamStore& store, Ops& ops, int B, int T)
    : DecoderStage(model, store, ops, B, T, whole_model_layers(model), StageSlots{}, Recompute::none) {}

DecoderStage::DecoderStage(const ModelSection& model, ParamStore& store, Ops& ops, int B, int T, const StageLayers& layers,
                     StageSlots slots, Recompute recompute, const ModelParallel& mp, const Fp8Recipe& fp8)
    : d_(StageDims::make(model, B, T, mp.tp_size(), mp.sequence_parallel, mp.cp_size(), mp.ep ? mp.ep->size() : 1,
                            mp.dp_cp ? mp.dp_cp->size() : 1)),
      store_(store),
      ops_(ops),
      layers_(layers),
      recompute_(recompute),
      mp_(mp),
      fp8_(fp8) {
  check(layers.first_layer >= 0 && layers.first_layer < layers.end_layer && layers.end_layer <= model.n_layers,
        "DecoderStage: the blocks [" + std::to_string(layers.first_layer) + ", " + std::to_string(layers.end_layer) +
            ") are not a non-empty range of the model's " + std::to_string(model.n_layers));
  check(slots.io >= 1 && slots.activations >= 1, "DecoderStage: at least one slot of each kind");
  const StageDims& d = d_;
  const size_t N = d.N, rows = d.rows, RC = d.rows_c();
  // attention channels (q heads, the attention output), the q|k|v projection, the MLP hidden
  // width and its up-projection (twice the hidden width with SwiGLU's gate)
  const size_t AC = size_t(d.N) * d.Cl, QKV = size_t(d.N) * d.QKVl, FC = size_t(d.N) * d.Fl, UC = size_t(d.N) * d.Ul;
  const bool ln_mean = d.norm_mean();
  const DType act = ops.compute_dtype(), f32 = DType::f32;
  const int L = layers.layers();

  // The roles, resolved once (roles_). Under expert parallel the routed experts' roles are in
  // their own store.
  roles_.resize(static_cast<size_t>(model.n_layers) + 2);
  for (int layer = -1; layer <= model.n_layers; layer++)
    for (size_t r = 0; r < kParamRoles; r++) {
      const ParamRole role = static_cast<ParamRole>(r);
      const bool expert = role == ParamRole::expert_up || role == ParamRole::expert_down;
      roles_[static_cast<size_t>(layer + 1)][r] = (expert && mp.experts ? *mp.experts : store).role(role, layer);
    }

  // Per slot, per block: what the recompute mode keeps. The last block's output is output_.
  const bool none = recompute == Recompute::none, selective = recompute == Recompute::selective;
  io_.resize(static_cast<size_t>(slots.io));
  for (IoSlot& s : io_) {
    s.input = alloc_act(RC, act);
    s.dres = alloc_act(RC, act);
  }
  // The buffers selective recompute rebuilds (norm outputs and stats, attention output and
  // lse, the MLP activation's output), and the matmul inputs only full recompute rebuilds. A slot
  // keeps what its mode does not rebuild; the shared set holds the rest, written again in backward.
  auto alloc_selective_buffers = [&](LayerActs& a) {
    a.ln1 = alloc_act(RC, act);
    if (ln_mean) a.ln1_mean = alloc_act(rows, f32);
    a.ln1_rstd = alloc_act(rows, f32);
    a.atty = alloc_act(AC, act);
    a.lse = alloc_act(d.lse(), f32);
    a.ln2 = alloc_act(RC, act);
    if (ln_mean) a.ln2_mean = alloc_act(rows, f32);
    a.ln2_rstd = alloc_act(rows, f32);
    a.fch_gelu = alloc_act(FC, act);
  };
  auto alloc_matmul_inputs = [&](LayerActs& a) {
    a.qkv = alloc_act(QKV, act);
    a.res2 = alloc_act(RC, act);
    a.fch = alloc_act(UC, act);
  };
  acts_.resize(static_cast<size_t>(slots.activations));
  for (ActSlot& s : acts_) {
    if (layers.embedding) s.tokens = alloc_act(N, DType::i32);
    s.kept.resize(static_cast<size_t>(L));
    for (int i = 0; i < L; i++) {
      LayerActs& a = s.kept[static_cast<size_t>(i)];
      if (none) alloc_selective_buffers(a);
      if (none || selective) alloc_matmul_inputs(a);
      if (i + 1 < L) a.res3 = alloc_act(RC, act);
    }
  }
  // The shared set: what no slot keeps, and the two projections (read only by their residual add).
  LayerActs& sh = shared_;
  sh.attproj = alloc_act(RC, act);
  sh.fcproj = alloc_act(RC, act);
  if (!none) alloc_selective_buffers(sh);
  if (recompute == Recompute::full) alloc_matmul_inputs(sh);
  output_ = alloc_act(RC, act);

  // The global position of each of this rank's tokens (context parallel: its chunks'), for the
  // B sequences' T tokens (the position embedding's backward; RoPE in every block) and for each
  // residual row (the position embedding's forward; sequence parallel: this tp rank's rows only).
  const bool learned_positions = d.learned_positions();
  const CpSplit split(cp_split_kind(mp.cp_impl), T, d.cp);
  const std::vector<int32_t> pos = split.positions(mp.cp_rank());
  if ((layers.embedding && learned_positions) || arch_.positions == PositionKind::rope) {
    pos_ = alloc_act(d.T, DType::i32);
    ops.upload(pos_, pos.data(), DType::i32, d.T);
  }
  if (layers.embedding && learned_positions) {
    std::vector<int32_t> row_pos(rows);
    const size_t first_row = d.sp ? size_t(mp.tp_rank()) * rows : 0;
    for (size_t r = 0; r < rows; r++) row_pos[r] = pos[(first_row + r) % d.T];
    pos_rows_ = alloc_act(rows, DType::i32);
    ops.upload(pos_rows_, row_pos.data(), DType::i32, rows);
  }
  if (layers.embedding && d.sp) emb_full_ = alloc_act(N * d.C, act);
  if (layers.head) {
    targets_ = alloc_act(N, DType::i32);
    lnf_ = alloc_act(RC, act);
    if (ln_mean) lnf_mean_ = alloc_act(rows, f32);
    lnf_rstd_ = alloc_act(rows, f32);
    head_rows_ = head_chunk_rows(static_cast<int>(N), d.Vl, act);  // one chunk's logits, not N rows'
    logits_ = alloc_act(size_t(head_rows_) * d.Vl, act);
    losses_ = alloc_act(N, f32);
    loss_sum_ = alloc_act(1, f32);
  }
  dbtc_ = alloc_act(std::max(RC, AC), act);  // a residual-row gradient, or the attention output's
  dqkv_ = alloc_act(QKV, act);
  dfch_ = alloc_act(UC, act);
  if (d.act_out_grad()) dfch_gelu_ = alloc_act(FC, act);
  if (d.sp) ln_grads_ = alloc_act((arch_.norm_has_bias() ? 2 : 1) * size_t(d.C), f32);

  if (mp.tp) {
    tp_comm_ = mp.tp;
  } else {
    own_tp_ = std::make_unique<LocalComm>(0, ops);
    tp_comm_ = own_tp_.get();
  }
  tp_ = std::make_unique<TensorParallel>(ops, *tp_comm_, d.sp);
  fp8_sites_ = pt::fp8_sites(fp8_, layers, arch_);
  if (const int sites = fp8_sites_.count(); sites > 0) {
    if (ops.device() == Device::cuda) Fp8Linear::check_gpu_shapes(d.N, fp8_layer_shapes(d, layers, fp8_, act));
    if (fp8_.delayed) fp8_delayed_ = std::make_unique<Fp8Delayed>(ops, sites, fp8_.amax_history, *tp_comm_, mp.dp_cp);
    tp_->enable_fp8(mp.cp, fp8_.grad, fp8_.rowwise, fp8_delayed_.get());
    activation_bytes_ += fp8_scratch_bytes(d, layers, fp8_, act);
  }
  if (d.tp > 1 && layers.head) vocab_ce_ = std::make_unique<VocabParallelCrossEntropy>(ops, *tp_comm_);
  attention_ = std::make_unique<CpAttention>(
      ops, mp.cp, mp.cp_impl, d.B, d.T, d.Cl, d.NHl, d.NKVl, act,
      fp8_.on(Fp8Layer::attention) ? AttentionPrecision::fp8 : AttentionPrecision::compute);
  activation_bytes_ += CpAttention::scratch_bytes(mp.cp_impl, d.cp, d.B, d.T, d.Cl, d.NHl, d.NKVl, act);
  // The tensor-parallel buffers grow during the first step; counted now, at the size they reach.
  activation_bytes_ += TensorParallel::scratch_bytes(d.tp, d.sp, d.N, d.C, act);
  if (vocab_ce_) activation_bytes_ += VocabParallelCrossEntropy::scratch_bytes(d.tp, d.N);

  // Mixture of experts: this stage's sparse blocks route the rows of the residual stream they
  // hold; the micro-batch's tokens are spread over the sequence-parallel tp group and cp.
  int sparse = 0;
  for (int l = layers.first_layer; l < layers.end_layer; l++)
    sparse_index_.push_back(arch_.sparse_block(l) ? sparse++ : -1);
  if (sparse > 0) {
    Comm* sp_group = d.sp ? tp_comm_ : nullptr;
    moe_ = std::make_unique<MoeLayer>(ops, arch_, static_cast<int>(rows), sparse, slots.activations,
                                      std::vector<Comm*>{sp_group, mp.cp}, sp_group,
                                      [this](size_t n, DType t) { return alloc_act(n, t); }, mp.ep);
    moe_out_ = alloc_act(RC, act);
    if (fp8_sites_.sparse > 0) {  // the routed experts in FP8 (delayed scaling: config_rules.cpp checks)
      check(fp8_delayed_ != nullptr, "DecoderStage: the routed experts' FP8 needs precision.fp8=delayed");
      moe_->enable_fp8(fp8_delayed_.get(), fp8_sites_, fp8_.grad,
                       [this](size_t n, DType t) { return alloc_act(n, t); });
      activation_bytes_ += moe_->fp8_products_bytes();
    }
  }
}

DecoderStage::~DecoderStage() {
  for (auto& t : owned_) ops_.release(t);
}

Tensor DecoderStage::alloc_act(size_t n, DType dtype) {
  Tensor t = ops_.alloc(n, dtype);
  owned_.push_back(t);
  activation_bytes_ += t.bytes();
  return t;
}

void DecoderStage::check_slots(MicroSlot at) const {
  check(at.activations >= 0 && at.activations < static_cast<int>(acts_.size()),
        "DecoderStage: activation slot " + std::to_string(at.activations) + " of " + std::to_string(acts_.size()));
  io(at.io);
}

const DecoderStage::IoSlot& DecoderStage::io(int io_slot) const {
  check(io_slot >= 0 && io_slot < static_cast<int>(io_.size()),
        "DecoderStage: I/O slot " + std::to_string(io_slot) + " of " + std::to_string(io_.size()));
  return io_[static_cast<size_t>(io_slot)];
}

Tensor DecoderStage::input(int io_slot) const {
  check(!layers_.embedding, "DecoderStage: the first stage computes its input from tokens");
  return io(io_slot).input;
}

Tensor DecoderStage::output() const {
  check(!layers_.head, "DecoderStage: the last stage ends in the loss, not an activation");
  return output_;
}

Tensor DecoderStage::grad_output(int io_slot) const {
  check(!layers_.head, "DecoderStage: the last stage's gradient comes from its loss");
  return io(io_slot).dres;
}

Tensor DecoderStage::grad_input(int io_slot) const {
  check(!layers_.embedding, "DecoderStage: the first stage sends no gradient back");
  return io(io_slot).dres;
}

Tensor DecoderStage::role_tensor(ParamRole role, int layer, bool grad) const {
  const ParamStore::Role& r = roles_[static_cast<size_t>(layer + 1)][static_cast<size_t>(role)];
  return grad ? r.grad() : r.param();
}

DecoderStage::LayerParams DecoderStage::layer_params(int l, bool grads) const {
  auto get = [&](ParamRole r) { return role_tensor(r, l, grads); };
  using R = ParamRole;
  return {get(R::norm1),  get(R::norm1_bias),    get(R::qkv),    get(R::qkv_bias),    get(R::attn_out),
          get(R::attn_out_bias), get(R::norm2), get(R::norm2_bias), get(R::mlp_up), get(R::mlp_up_bias),
          get(R::mlp_down), get(R::mlp_down_bias), {get(R::moe_router), get(R::expert_up), get(R::expert_down)}};
}

DecoderStage::LayerActs DecoderStage::buffers(const ActSlot& s, int l) const {
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

Tensor DecoderStage::block_input(const IoSlot& io, const ActSlot& s, int l) const {
  return l == layers_.first_layer ? io.input : s.kept[static_cast<size_t>(l - 1 - layers_.first_layer)].res3;
}

void DecoderStage::norm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b) {
  if (arch_.norm == NormKind::layernorm) return ops_.layernorm_forward(out, mean, rstd, x, w, b, d_.rows, d_.C);
  ops_.rmsnorm_forward(out, rstd, x, w, d_.rows, d_.C, arch_.norm_eps);
}

void DecoderStage::residual_norm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b,
                                         Tensor w, Tensor bias) {
  if (arch_.norm == NormKind::layernorm)
    return ops_.residual_layernorm_forward(residual, out, mean, rstd, a, b, w, bias, d_.rows, d_.C);
  ops_.residual_rmsnorm_forward(residual, out, rstd, a, b, w, d_.rows, d_.C, arch_.norm_eps);
}

void DecoderStage::mlp_activation_forward(const LayerActs& a, int l) {
  const int F = mlp_local(l);
  if (F == 0) return;  // a sparse block without shared experts
  if (arch_.mlp == MlpKind::gelu) return ops_.gelu_forward(a.fch_gelu, a.fch, size_t(d_.N) * F);
  ops_.swiglu_forward(a.fch_gelu, a.fch, d_.N, F);
}

void DecoderStage::rope(Tensor qkv, bool backward) {
  if (arch_.positions != PositionKind::rope) return;
  const StageDims& d = d_;
  // The q and k heads of each row, at the tokens' global positions (context parallel: this
  // rank's chunks); v is not rotated.
  if (backward)
    ops_.rope_backward(qkv, pos_, d.B, d.T, d.QKVl, d.NHl + d.NKVl, arch_.head_dim, arch_.rope_theta);
  else
    ops_.rope_forward(qkv, pos_, d.B, d.T, d.QKVl, d.NHl + d.NKVl, arch_.head_dim, arch_.rope_theta);
}

Fp8Site DecoderStage::fp8_site(int l, Fp8Layer layer) const {
  if (!fp8_.on(layer)) return {};
  if (layer == Fp8Layer::lm_head) return {fp8_sites_.lm_head()};
  return {fp8_sites_.block(l - layers_.first_layer, layer)};
}

void DecoderStage::fp8_begin_step() {
  if (fp8_delayed_) fp8_delayed_->begin_step();
}

void DecoderStage::fp8_end_step(bool keep) {
  if (fp8_delayed_) fp8_delayed_->end_step(keep);
}

void DecoderStage::block_forward(const LayerActs& a, const LayerParams& p, Tensor x, bool ln1_ready, bool to_gelu,
                                 int l, int slot) {
  const StageDims& d = d_;
  const int N = d.N, C = d.C;
  if (!ln1_ready) norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b);
  tp_->column_forward(a.qkv, a.ln1, p.qkvw, p.qkvb, N, C, d.QKVl, fp8_site(l, Fp8Layer::qkv));
  rope(a.qkv, false);  // in place: attention, and its backward, read the rotated q and k
  attention_->forward(a.atty, a.lse, a.qkv);
  tp_->row_forward(a.attproj, a.atty, p.projw, p.projb, N, d.Cl, C, fp8_site(l, Fp8Layer::attn_out));
  // res2 = x + attproj, and norm_2 of it, in one pass (the norm sees the stored res2).
  residual_norm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, a.attproj, p.ln2w, p.ln2b);
  // The MLP: dense (a sparse block's shared experts, if any), then a sparse block's routed
  // experts added to it. Full recompute stops after the dense activation: backward needs
  // nothing later, and the routed experts keep their own activations (moe_layer.h).
  const int F = mlp_local(l);
  if (F > 0) {
    tp_->column_forward(a.fch, a.ln2, p.fcw, p.fcb, N, C, up_local(l), fp8_site(l, Fp8Layer::mlp_up));
    mlp_activation_forward(a, l);
  }
  if (to_gelu) return;
  if (F > 0) tp_->row_forward(a.fcproj, a.fch_gelu, p.fcprojw, p.fcprojb, N, F, C, fp8_site(l, Fp8Layer::mlp_down));
  if (arch_.sparse_block(l)) {
    const Tensor out = F > 0 ? moe_out_ : a.fcproj;
    moe_->forward(slot, sparse_index(l), out, a.ln2, d.rows, p.moe, aux_weight_, training_);
    if (F > 0) ops_.add(a.fcproj, a.fcproj, moe_out_, d.rows_c());
  }
}

void DecoderStage::recompute_block(const LayerActs& a, const LayerParams& p, Tensor x, int l, int slot) {
  switch (recompute_) {
    case Recompute::none: return;
    case Recompute::full: return block_forward(a, p, x, false, true, l, slot);
    case Recompute::selective:
      // From the kept qkv (rotated already), res2 and fch: the norm outputs, the attention output
      // and its log-sum-exps, the activation's output. Same kernels, same inputs: the same bits as
      // forward's (forward's fused residual + norm is bitwise the norm of the stored residual).
      norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b);
      attention_->forward(a.atty, a.lse, a.qkv);
      norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b);
      mlp_activation_forward(a, l);
      return;
  }
}

void DecoderStage::embed(Tensor out, Tensor tokens) {
  const StageDims& d = d_;
  // Each tp rank looks the tokens up in its vocabulary rows (zero for the others); the sum over
  // tp is the embedding. Under sequence parallel the sum is reduce-scattered to this rank's rows.
  const Tensor full = d.sp ? emb_full_ : out;
  ops_.embedding_forward(full, tokens, role_tensor(ParamRole::token_embedding, -1, false), d.N, d.C,
                         mp_.tp_rank() * d.Vl, d.Vl);
  if (d.sp)
    tp_->reduce_scatter_tokens(out, full, d.N, d.C);
  else if (d.tp > 1)
    tp_comm_->all_reduce(out);
  if (arch_.positions == PositionKind::learned)
    ops_.position_forward(out, role_tensor(ParamRole::position_embedding, -1, false), pos_rows_, 1, d.rows, d.C);
}

void DecoderStage::embed_backward(Tensor dres, Tensor tokens) {
  const StageDims& d = d_;
  // Every token's gradient (sequence parallel: all-gathered), so that each tp rank gets its
  // vocabulary rows' gradient and the whole position-embedding gradient without a reduction.
  Tensor dfull = dres;
  if (d.sp) {
    tp_->gather_tokens(emb_full_, dres, d.N, d.C);
    dfull = emb_full_;
  }
  ops_.embedding_backward(role_tensor(ParamRole::token_embedding, -1, true), dfull, tokens, d.N, d.C,
                          mp_.tp_rank() * d.Vl, d.Vl);
  if (arch_.positions == PositionKind::learned)
    ops_.position_backward(role_tensor(ParamRole::position_embedding, -1, true), dfull, pos_, d.B, d.T, d.C);
}

Tensor DecoderStage::logits() const {
  check(head_rows_ == d_.N, "DecoderStage::logits: the head ran in chunks of " + std::to_string(head_rows_) + " of " +
                                std::to_string(d_.N) + " rows, so the whole logits never existed");
  return logits_;
}

void DecoderStage::norm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                                 Tensor rstd) {
  const StageDims& d = d_;
  const bool layernorm = arch_.norm == NormKind::layernorm;
  auto run = [&](Tensor gw, Tensor gb) {
    if (layernorm) ops_.layernorm_backward(dinp, gw, gb, dout, inp, w, mean, rstd, d.rows, d.C);
    else ops_.rmsnorm_backward(dinp, gw, dout, inp, w, rstd, d.rows, d.C);
  };
  if (!d.sp) return run(dw, db);
  // This rank's tokens give part of the weight gradients: sum this micro-batch's parts over tp
  // before adding them (the gradient buffers may hold earlier micro-batches, summed already).
  const Tensor gw = ln_grads_.slice(0, d.C), gb = layernorm ? ln_grads_.slice(d.C, d.C) : Tensor{};
  ops_.zero(ln_grads_);
  run(gw, gb);
  tp_comm_->all_reduce(ln_grads_);
  ops_.add(dw, dw, gw, d.C);
  if (layernorm) ops_.add(db, db, gb, d.C);
}

double DecoderStage::forward(MicroSlot at, const int32_t* tokens, const int32_t* targets, float dloss) {
  check_slots(at);
  const size_t N = static_cast<size_t>(d_.N);
  ActSlot& s = acts_[static_cast<size_t>(at.activations)];
  if (layers_.embedding) ops_.upload(s.tokens, tokens, DType::i32, N);
  if (layers_.head) ops_.upload(targets_, targets, DType::i32, N);
  forward(at, layers_.embedding ? s.tokens : Tensor{}, layers_.head ? targets_ : Tensor{}, dloss, loss_sum_);
  if (!layers_.head) return 0.0;
  float sum = 0;
  ops_.download(&sum, DType::f32, loss_sum_, 1);
  return sum;
}

void DecoderStage::forward(MicroSlot at, Tensor tokens, Tensor targets, float dloss, Tensor loss_sum) {
  check_slots(at);
  ActSlot& s = acts_[static_cast<size_t>(at.activations)];
  const IoSlot& in = io_[static_cast<size_t>(at.io)];
  check(!s.backward_due, "DecoderStage: activation slot " + std::to_string(at.activations) +
                             " still holds a micro-batch whose backward has not run");
  const StageDims& d = d_;
  const int N = d.N, C = d.C;
  const int embeddings = -1, final_norm = arch_.n_layers;  // ParamSpec::layer of the non-block layers
  // The balancing loss enters the objective as aux_loss_coef x its mean over the sparse blocks,
  // per micro-batch, weighted like the micro-batch's B x seq_len tokens of cross-entropy (whose
  // per-token gradient is dloss).
  training_ = dloss != 0.0f;
  aux_weight_ = arch_.sparse_blocks() > 0 ? static_cast<float>(double(arch_.aux_loss_coef) / arch_.sparse_blocks() *
                                                               dloss * double(d.B) * d.T * d.cp)
                                          : 0.0f;

  if (layers_.embedding) {
    check(tokens.numel >= size_t(N) && tokens.dtype == DType::i32,
          "DecoderStage::forward: the embedding needs " + std::to_string(N) + " i32 token ids on the device");
    ops_.copy(s.tokens, tokens, N);  // kept for the embedding's backward (a no-op from the host form)
    hooks_->acquire_params(embeddings);
    embed(in.input, s.tokens);
    hooks_->release_params(embeddings);
  }

  // The residual stream entering each block. Each block ends in the residual add
  // res3 = res2 + fcproj; where a norm follows in this stage (the next block's norm_1, or
  // the final norm with the head) the add is fused with it, after the block's parameters are released and
  // the next layer's acquired (the add reads no parameter, so at most one layer is gathered at a
  // time, as before). The last block of a stage without the head keeps the plain add.
  Tensor x = in.input;
  bool ln1_ready = false;  // x's norm_1 (of block l) was computed by the fused add before it
  for (int l = layers_.first_layer; l < layers_.end_layer; l++) {
    if (!ln1_ready) hooks_->acquire_params(l);  // else acquired for the fused add
    const LayerActs a = buffers(s, l);
    block_forward(a, layer_params(l, false), x, ln1_ready, false, l, at.activations);
    hooks_->release_params(l);
    if (l + 1 < layers_.end_layer) {
      hooks_->acquire_params(l + 1);
      const LayerActs next = buffers(s, l + 1);
      const LayerParams pn = layer_params(l + 1, false);
      residual_norm_forward(a.res3, next.ln1, next.ln1_mean, next.ln1_rstd, a.res2, a.fcproj, pn.ln1w, pn.ln1b);
      ln1_ready = true;
    } else if (layers_.head) {
      hooks_->acquire_params(final_norm);
      residual_norm_forward(a.res3, lnf_, lnf_mean_, lnf_rstd_, a.res2, a.fcproj,
                            role_tensor(ParamRole::final_norm, final_norm, false),
                            role_tensor(ParamRole::final_norm_bias, final_norm, false));
    } else {
      ops_.add(a.res3, a.res2, a.fcproj, d.rows_c());
    }
    x = a.res3;
  }
  s.backward_due = dloss != 0.0f;
  if (!layers_.head) return;

  check(targets.numel >= size_t(N) && targets.dtype == DType::i32 && loss_sum.numel >= 1,
        "DecoderStage::forward: the head needs " + std::to_string(N) + " i32 targets and a loss sum on the device");
  ops_.copy(targets_, targets, N);
  // The LM head, logits = lnf @ W^T over this rank's vocabulary rows: W is the token embedding
  // when tied (an embeddings-layer tensor), else the head's own (the final norm's layer, acquired).
  const bool tied = arch_.tied_head;
  const int head_layer = tied ? embeddings : final_norm;
  const ParamRole head_role = tied ? ParamRole::token_embedding : ParamRole::head;
  if (tied) hooks_->acquire_params(embeddings);
  const Tensor head_w = role_tensor(head_role, head_layer, false);
  Tensor head_dw;
  if (s.backward_due) {
    if (tied) hooks_->acquire_grads(embeddings);
    hooks_->acquire_grads(final_norm);
    head_dw = role_tensor(head_role, head_layer, true);
  }
  // The head in chunks of rows (core/model/head_chunks.h): each chunk's logits, its cross-entropy
  // (the logits become their gradient in place) and its backward, before the next chunk. Only
  // the gradient of the last block's output is kept for backward(slot).
  tp_->column_chunked(logits_, s.backward_due ? dbtc_ : Tensor{}, head_dw, lnf_, head_w, N, C, d.Vl, head_rows_,
                      fp8_site(-1, Fp8Layer::lm_head), [&](int r0, int n, Tensor logits) {
                        const Tensor losses = losses_.slice(size_t(r0), size_t(n));
                        const Tensor targets = targets_.slice(size_t(r0), size_t(n));
                        if (vocab_ce_)
                          vocab_ce_->forward_backward(losses, logits, targets, n, arch_.vocab_size, d.Vl, dloss);
                        else
                          ops_.softmax_cross_entropy(losses, logits, targets, n, arch_.vocab_size, d.Vl, dloss);
                      });
  if (s.backward_due) {
    ops_.zero(in.dres);
    norm_backward(in.dres, role_tensor(ParamRole::final_norm, final_norm, true),
                  role_tensor(ParamRole::final_norm_bias, final_norm, true), dbtc_, x,
                  role_tensor(ParamRole::final_norm, final_norm, false), lnf_mean_, lnf_rstd_);
  }
  if (tied) hooks_->release_params(embeddings);
  hooks_->release_params(final_norm);
  if (s.backward_due) {
    hooks_->grads_ready(final_norm);
    // A head without the embedding holds the tied copy of the token embedding: final for this
    // micro-batch.
    if (tied && !layers_.embedding) hooks_->grads_ready(embeddings);
  }
  ops_.sum_to(loss_sum, losses_, N);
}

void DecoderStage::backward(MicroSlot at) {
  check_slots(at);
  ActSlot& s = acts_[static_cast<size_t>(at.activations)];
  const IoSlot& in = io_[static_cast<size_t>(at.io)];
  check(s.backward_due, "DecoderStage::backward of activation slot " + std::to_string(at.activations) +
                            " without a training forward pass");
  const StageDims& d = d_;
  const int N = d.N, C = d.C;
  const int embeddings = -1;
  const Tensor dln = dbtc_.slice(0, d.rows_c());               // a norm output's gradient
  const Tensor datty = dbtc_.slice(0, size_t(N) * d.Cl);       // the attention output's

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
    recompute_block(a, p, x, l, at.activations);
    // MLP branch: res3 = res2 + fcproj(act(fc(ln2(res2)))). The matmuls', the activation's
    // and attention's input gradients are overwritten (Ops), so only the residual stream (+=)
    // starts from zeros.
    const int F = mlp_local(l);
    if (F > 0) {
      if (arch_.mlp == MlpKind::gelu) {  // the GELU's backward inside the projection's (every mode)
        tp_->row_backward_dgelu(dfch_, g.fcprojw, g.fcprojb, dres, a.fch_gelu, p.fcprojw, a.fch, N, F, C,
                                fp8_site(l, Fp8Layer::mlp_down));
      } else {
        tp_->row_backward(dfch_gelu_, g.fcprojw, g.fcprojb, dres, a.fch_gelu, p.fcprojw, N, F, C, fp8_site(l, Fp8Layer::mlp_down));
        ops_.swiglu_backward(dfch_, a.fch, dfch_gelu_, N, F);
      }
      tp_->column_backward(dln, g.fcw, g.fcb, dfch_, a.ln2, p.fcw, N, C, up_local(l), fp8_site(l, Fp8Layer::mlp_up));
    } else {
      ops_.zero(dln);
    }
    // A sparse block's routed experts: their output's gradient is the residual stream's (dres,
    // before the norm below adds to it); they add their input's gradient to the norm output's.
    if (arch_.sparse_block(l)) moe_->backward(at.activations, sparse_index(l), dln, dres, a.ln2, d.rows, p.moe, g.moe);
    norm_backward(dres, g.ln2w, g.ln2b, dln, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd);
    // Attention branch: res2 = x + proj(attention(rope(qkv(ln1(x)))))
    tp_->row_backward(datty, g.projw, g.projb, dres, a.atty, p.projw, N, d.Cl, C, fp8_site(l, Fp8Layer::attn_out));
    attention_->backward(dqkv_, datty, a.qkv, a.atty, a.lse);
    rope(dqkv_, true);  // the gradient of the projection's output, before the rotation
    tp_->column_backward(dln, g.qkvw, g.qkvb, dqkv_, a.ln1, p.qkvw, N, C, d.QKVl, fp8_site(l, Fp8Layer::qkv));
    norm_backward(dres, g.ln1w, g.ln1b, dln, x, p.ln1w, a.ln1_mean, a.ln1_rstd);
    hooks_->release_params(l);
    hooks_->grads_ready(l);
  }

  if (layers_.embedding) {
    // The embedding backward reads no parameter values, only the gradient.
    hooks_->acquire_grads(embeddings);
    embed_backward(dres, s.tokens);
    hooks_->grads_ready(embeddings);
  }
  s.backward_due = false;
}

DecoderStage::HostMarks DecoderStage::host_marks() const {
  HostMarks m;
  for (const ActSlot& s : acts_) m.backward_due.push_back(s.backward_due);
  m.moe_batches = moe_ ? moe_->counted_batches() : 0.0;
  return m;
}

void DecoderStage::restore(const HostMarks& m) {
  check(m.backward_due.size() == acts_.size(), "internal error: DecoderStage::restore of another stage's marks");
  for (size_t i = 0; i < acts_.size(); i++) acts_[i].backward_due = m.backward_due[i];
  if (moe_) moe_->set_counted_batches(m.moe_batches);
}

void DecoderStage::after_replay(bool forward, MicroSlot at, float dloss) {
  check_slots(at);
  ActSlot& s = acts_[static_cast<size_t>(at.activations)];
  check(s.backward_due != forward, std::string("internal error: a replayed ") + (forward ? "forward" : "backward") +
                                       " of activation slot " + std::to_string(at.activations) + " out of order");
  s.backward_due = forward && dloss != 0.0f;
  if (!moe_ || !s.backward_due) return;
  check(!moe_->records_routing(), "DecoderStage: a replayed forward cannot record the routing choices");
  // Each sparse block's training forward counts one (MoeLayer::balancing_loss).
  const auto sparse = std::count_if(sparse_index_.begin(), sparse_index_.end(), [](int i) { return i >= 0; });
  moe_->set_counted_batches(moe_->counted_batches() + static_cast<double>(sparse));
}

}  // namespace pt
