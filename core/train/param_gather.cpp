#include "core/train/param_gather.h"

#include <algorithm>

#include "core/parallel/fp8_linear.h"

namespace pt {

std::vector<bool> fp8_gathered_params(const ParamTable& table, const RunConfig& cfg) {
  std::vector<bool> out(table.specs().size(), false);
  const Fp8Recipe r = fp8_recipe(cfg.precision);
  if (!r.any() || r.rowwise || r.delayed || !cfg.precision.fp8_weight_gather || cfg.parallel.zero_stage != 3) return out;
  // An untied LM head's weight too; a tied one is the token embedding, whose lookup needs its
  // values, not their FP8 codes.
  const std::pair<ParamRole, Fp8Layer> roles[] = {{ParamRole::qkv, Fp8Layer::qkv},
                                                  {ParamRole::attn_out, Fp8Layer::attn_out},
                                                  {ParamRole::mlp_up, Fp8Layer::mlp_up},
                                                  {ParamRole::mlp_down, Fp8Layer::mlp_down},
                                                  {ParamRole::head, Fp8Layer::lm_head}};
  for (size_t i = 0; i < out.size(); i++)
    for (const auto& [role, layer] : roles)
      if (table.specs()[i].role == role && r.on(layer)) out[i] = true;
  return out;
}

namespace {
// The part of [a, b) inside [lo, hi) (empty: begin == end).
struct Overlap {
  size_t begin, end;
  size_t size() const { return end - begin; }
};
Overlap overlap(size_t a, size_t b, size_t lo, size_t hi) {
  const size_t s = std::max(a, lo), e = std::min(b, hi);
  return {s, std::max(s, e)};
}
}  // namespace

std::vector<ParamGather::Fp8Plan> ParamGather::plan_fp8(const ShardLayout& layout, const ParamTable& table,
                                                        const std::vector<bool>& fp8) {
  check(fp8.size() == table.specs().size(), "ParamGather: FP8 flags for " + std::to_string(fp8.size()) + " of " +
                                                std::to_string(table.specs().size()) + " parameters");
  std::vector<Fp8Plan> plans(static_cast<size_t>(layout.last_layer() - layout.first_layer() + 1));
  if (layout.params_resident() || layout.single_shard()) return plans;
  for (int l = layout.first_layer(); l <= layout.last_layer(); l++) {
    if (!layout.holds_layer(l)) continue;
    const Bucket& b = layout.bucket_of_layer(l);
    Fp8Plan& plan = plans[static_cast<size_t>(l - layout.first_layer())];
    for (size_t i = 0; i < table.specs().size(); i++) {
      const ParamSpec& p = table.specs()[i];
      if (p.offset < b.begin || p.offset >= b.end) continue;
      (fp8[i] ? plan.weights : plan.others).push_back({p.offset - b.begin, p.offset - b.begin + p.numel});
    }
    if (plan.weights.empty()) {
      plan.others.clear();
      continue;
    }
    const size_t q = layout.piece_numel(b);
    for (int r = 0; r < layout.shard_count(); r++) {
      size_t held = 0;
      for (const Range& o : plan.others) held += overlap(o.begin, o.end, r * q, (r + 1) * q).size();
      plan.packed = std::max(plan.packed, held);
    }
  }
  return plans;
}

ParamGather::Fp8Sizes ParamGather::fp8_sizes(const ShardLayout& layout, const std::vector<Fp8Plan>& plans) {
  Fp8Sizes z;
  for (int l = layout.first_layer(); l <= layout.last_layer(); l++) {
    const Fp8Plan& plan = plans[static_cast<size_t>(l - layout.first_layer())];
    if (plan.weights.empty()) continue;
    const Bucket& b = layout.bucket_of_layer(l);
    z.codes = std::max(z.codes, b.padded), z.piece = std::max(z.piece, layout.piece_numel(b));
    z.packed = std::max(z.packed, plan.packed), z.weights = std::max(z.weights, plan.weights.size());
  }
  return z;
}

size_t ParamGather::fp8_scratch_bytes(const ShardLayout& layout, const ParamTable& table, const std::vector<bool>& fp8,
                                      DType compute, int tp) {
  const Fp8Sizes z = fp8_sizes(layout, plan_fp8(layout, table, fp8));
  if (z.weights == 0) return 0;
  const size_t S = size_t(layout.shard_count());
  // Codes (one byte each): everyone's and this rank's; the packed others, everyone's and this
  // rank's (at least one element each); amaxes (this rank's, every shard's and tp part's, the
  // whole's) and scales.
  return z.codes + z.piece + dtype_size(compute) * (std::max<size_t>(1, S * z.packed) + std::max<size_t>(1, z.packed)) +
         sizeof(float) * z.weights * (3 + S * size_t(tp));
}

void ParamGather::enable_fp8(const std::vector<bool>& fp8, Comm& tp) {
  fp8_ = plan_fp8(layout_, store_.table(), fp8);
  tp_ = &tp;
  const Fp8Sizes z = fp8_sizes(layout_, fp8_);
  if (z.weights == 0) return;
  const size_t S = size_t(shard_.size());
  codes_ = ops_.alloc(z.codes, DType::f8e4m3);
  own_codes_ = ops_.alloc(z.piece, DType::f8e4m3);
  packed_ = ops_.alloc(std::max<size_t>(1, S * z.packed), ops_.compute_dtype());
  own_packed_ = ops_.alloc(std::max<size_t>(1, z.packed), ops_.compute_dtype());
  amaxes_ = ops_.alloc(z.weights * (2 + S * size_t(tp.size())), DType::f32);
  scales_ = ops_.alloc(z.weights, DType::f32);
}

ParamGather::ParamGather(ParamStore& store, Ops& ops, Comm& shard)
    : store_(store), ops_(ops), shard_(shard), layout_(store.layout()) {
  working_.resize(static_cast<size_t>(layout_.last_layer() - layout_.first_layer() + 1));
}

ParamGather::~ParamGather() {
  for (int l = layout_.first_layer(); l <= layout_.last_layer(); l++) release(l);
  for (Tensor* t : {&codes_, &own_codes_, &packed_, &own_packed_, &amaxes_, &scales_})
    if (*t) ops_.release(*t);
}

void ParamGather::acquire(int layer) {
  if (layout_.params_resident()) return;
  Tensor& w = working_[static_cast<size_t>(layer - layout_.first_layer())];
  if (w) return;
  const Bucket& b = layout_.bucket_of_layer(layer);
  const Tensor piece = store_.param_shard().slice(b.shard_offset, layout_.piece_numel(b));
  if (layout_.single_shard()) {
    w = piece;  // one shard: the piece is the whole layer, used where it is
  } else {
    w = ops_.alloc(b.padded, ops_.compute_dtype());
    const size_t at = static_cast<size_t>(layer - layout_.first_layer());
    if (at < fp8_.size() && !fp8_[at].weights.empty()) gather_fp8(layer, fp8_[at], piece, w);
    else shard_.all_gather(piece, w);
  }
  store_.attach_params(layer, w);
}

void ParamGather::gather_fp8(int layer, const Fp8Plan& plan, Tensor piece, Tensor w) {
  const Bucket& b = layout_.bucket_of_layer(layer);
  const size_t q = layout_.piece_numel(b), mine = size_t(shard_.rank()) * q, S = size_t(shard_.size());
  const size_t W = plan.weights.size(), T = size_t(tp_->size());
  const Tensor own_amax = amaxes_.slice(0, W), rows = amaxes_.slice(W, S * T * W),
               whole = amaxes_.slice(W * (1 + S * T), W);
  // 1. The whole weights' amaxes: this rank's pieces', then every shard's and tp part's.
  ops_.zero(own_amax);
  for (size_t j = 0; j < W; j++) {
    const Overlap o = overlap(plan.weights[j].begin, plan.weights[j].end, mine, mine + q);
    if (o.size() > 0) ops_.fp8_amax(own_amax.slice(j, 1), piece.slice(o.begin - mine, o.size()), 1, int(o.size()), Fp8Amax::tensor);
  }
  const Tensor shard_rows = rows.slice(size_t(tp_->rank()) * S * W, S * W);
  shard_.all_gather(own_amax, shard_rows);
  if (T > 1) tp_->all_gather(shard_rows, rows);
  ops_.fp8_amax(whole, rows, int(S * T), int(W), Fp8Amax::cols);
  // 2. This rank's piece of each weight cast with the whole's scale (a weight it holds none of
  // still gets its scale: one element cast into a spare code), and the codes gathered.
  const Tensor own = own_codes_.slice(0, q), codes = codes_.slice(0, b.padded);
  for (size_t j = 0; j < W; j++) {
    const Overlap o = overlap(plan.weights[j].begin, plan.weights[j].end, mine, mine + q);
    const size_t at = o.size() > 0 ? o.begin - mine : 0, n = std::max<size_t>(o.size(), 1);
    const Tensor dst = o.size() > 0 ? own.slice(at, n) : codes.slice(0, 1);  // codes: overwritten below
    ops_.fp8_quantize(dst, scales_.slice(j, 1), piece.slice(at, n), whole.slice(j, 1), 1, 1, int(n), false, false,
                      Tensor{});
  }
  shard_.all_gather(own, codes);
  for (size_t j = 0; j < W; j++) {
    const Range& r = plan.weights[j];
    ops_.fp8_dequantize(w.slice(r.begin, r.end - r.begin), codes.slice(r.begin, r.end - r.begin), scales_.slice(j, 1),
                        r.end - r.begin);
  }
  // 3. The other parameters in the compute dtype: each rank packs what its piece holds of them.
  // The bucket's padding after them is zero, as a plain gather leaves it.
  if (b.padded > b.numel()) ops_.zero(w.slice(b.numel(), b.padded - b.numel()));
  if (plan.packed == 0) return;
  size_t at = 0;
  for (const Range& r : plan.others) {
    const Overlap o = overlap(r.begin, r.end, mine, mine + q);
    if (o.size() == 0) continue;
    ops_.copy(own_packed_.slice(at, o.size()), piece.slice(o.begin - mine, o.size()), o.size());
    at += o.size();
  }
  const Tensor all = packed_.slice(0, S * plan.packed);
  shard_.all_gather(own_packed_.slice(0, plan.packed), all);
  for (size_t rank = 0; rank < S; rank++) {
    size_t from = rank * plan.packed;
    for (const Range& r : plan.others) {
      const Overlap o = overlap(r.begin, r.end, rank * q, (rank + 1) * q);
      if (o.size() == 0) continue;
      ops_.copy(w.slice(o.begin, o.size()), all.slice(from, o.size()), o.size());
      from += o.size();
    }
  }
}

void ParamGather::release(int layer) {
  Tensor& w = working_[static_cast<size_t>(layer - layout_.first_layer())];
  if (!w) return;
  store_.detach_params(layer);
  if (layout_.single_shard()) w = Tensor{};  // a view of the shard, not ours to free
  else ops_.release(w);
}

void ParamGather::gather_updated() {
  // One shard: the optimizer updated every parameter in place; nothing to gather.
  if (layout_.single_shard() || !layout_.params_resident()) return;
  const Tensor params = store_.all_params();
  for (const auto& b : layout_.buckets()) {
    const size_t q = layout_.piece_numel(b);
    const Tensor full = params.slice(b.arena_offset, b.padded);
    shard_.all_gather(full.slice(static_cast<size_t>(layout_.shard_rank()) * q, q), full);  // in place
  }
}

}  // namespace pt
