#include "core/parallel/fp8_linear.h"

#include <algorithm>

#include "core/common/split_list.h"

namespace pt {

const std::vector<std::string>& fp8_layer_names() {
  static const std::vector<std::string> names = {"qkv", "attn_out", "mlp_up", "mlp_down", "lm_head", "experts", "attention"};
  return names;
}

Fp8Recipe parse_fp8_layers(const std::string& layers) {
  Fp8Recipe r;
  const std::vector<std::string>& names = fp8_layer_names();
  const auto set = [&](size_t i, const std::string& named_by) {
    if (r.layers[i]) throw ConfigError("names " + names[i] + " twice (in \"" + named_by + "\")");
    r.layers[i] = true;
  };
  for (const std::string& name : split_list(layers)) {
    const auto it = std::find(names.begin(), names.end(), name);
    if (name == "all") {
      for (size_t i = 0; i < kFp8BlockLayers; i++) set(i, name);
    } else if (it == names.end()) {
      throw ConfigError("\"" + name + "\" is not a layer: must be a comma-separated list of all (a block's linear "
                        "layers), qkv, attn_out, mlp_up, mlp_down, lm_head, experts, attention");
    } else {
      set(static_cast<size_t>(it - names.begin()), name);
    }
  }
  return r;
}

Fp8Recipe fp8_recipe(const std::string& fp8, const std::string& layers, const std::string& grad_format,
                     int amax_history) {
  if (fp8 == "off") return {};  // no layer in FP8
  check(fp8 == "tensorwise" || fp8 == "rowwise" || fp8 == "delayed", "fp8_recipe: unknown recipe \"" + fp8 + "\"");
  check(amax_history >= 1, "fp8_recipe: an amax history of " + std::to_string(amax_history) + " steps");
  Fp8Recipe r = parse_fp8_layers(layers);
  r.grad = grad_format == "e4m3" ? Fp8Format::e4m3 : Fp8Format::e5m2;
  r.rowwise = fp8 == "rowwise";
  r.delayed = fp8 == "delayed";
  r.amax_history = amax_history;
  return r;
}

Fp8Recipe fp8_recipe(const PrecisionSection& p) {
  return fp8_recipe(p.fp8, p.fp8_layers, p.fp8_grad_format, p.fp8_amax_history);
}

std::string fp8_layer_list(const Fp8Recipe& r, const std::string& separator) {
  std::string list;
  for (size_t i = 0; i < fp8_layer_names().size(); i++)
    if (r.layers[i]) list += (list.empty() ? "" : separator) + fp8_layer_names()[i];
  return list;
}

namespace {
DType fp8_dtype(Fp8Format f) { return f == Fp8Format::e4m3 ? DType::f8e4m3 : DType::f8e5m2; }

// A slot's floats for scales of `len` each: the scale_invs, rounded up to 16 bytes so that the
// amaxes after them (and every slot's scale_inv, a cuBLASLt scale pointer) stay as aligned as
// the allocation, then a tp x cp grid of amax blocks.
size_t meta_floats(size_t len, int tp, int cp) { return (len + 3) / 4 * 4 + size_t(tp) * cp * len; }
}  // namespace

Fp8Linear::Fp8Linear(Ops& ops, Comm& tp, Comm* cp, Fp8Format grad_format, bool rowwise)
    : ops_(ops), tp_(tp), cp_(cp && cp->size() > 1 ? cp : nullptr), grad_(grad_format), rowwise_(rowwise) {
  check(ops.supports_fp8(), "precision.fp8: this device cannot run FP8 matrix products (" +
                                ops.device_description() + "; FP8 needs compute capability 8.9 or later)");
  check(!rowwise || ops.supports_fp8_rowwise(),
        "precision.fp8=rowwise: this device cannot run rowwise-scaled FP8 products (" + ops.device_description() +
            "; they need compute capability 9.0 or later and cuBLAS 12.9+): use precision.fp8=tensorwise or delayed");
}

Fp8Linear::~Fp8Linear() {
  for (Tensor& t : codes_)
    if (t) ops_.release(t);
  for (Tensor& t : meta_)
    if (t) ops_.release(t);
}

std::array<Fp8Linear::SlotSize, Fp8Linear::kSlots> Fp8Linear::slot_sizes(size_t N, const std::vector<Shape>& shapes) {
  size_t x = 0, w = 0, dout = 0, in = 0, out = 0, rows = 0;
  for (const Shape& s : shapes) {
    const size_t n = s.rows > 0 ? s.rows : N;
    x = std::max(x, n * s.in), w = std::max(w, s.out * s.in), dout = std::max(dout, n * s.out);
    in = std::max(in, s.in), out = std::max(out, s.out), rows = std::max(rows, n);
  }
  std::array<SlotSize, kSlots> sizes;
  sizes[kX] = {x, rows, false}, sizes[kXT] = {x, in, false};
  sizes[kW] = {w, out, false}, sizes[kWT] = {w, in, false};
  sizes[kDout] = {dout, rows, true}, sizes[kDoutT] = {dout, out, true};
  return sizes;
}

size_t Fp8Linear::scratch_bytes(size_t N, const std::vector<Shape>& shapes, int tp, int cp, bool rowwise) {
  if (shapes.empty()) return 0;
  size_t bytes = 0;
  for (const SlotSize& s : slot_sizes(N, shapes))
    bytes += s.codes + sizeof(float) * meta_floats(rowwise ? s.scales : 1, tp, cp);
  return bytes;
}

void Fp8Linear::reserve(size_t N, const std::vector<Shape>& shapes) {
  const std::array<SlotSize, kSlots> sizes = slot_sizes(N, shapes);
  for (int slot = 0; slot < kSlots; slot++) {
    const SlotSize& s = sizes[size_t(slot)];
    const DType dtype = fp8_dtype(s.grad ? grad_ : Fp8Format::e4m3);
    Tensor& codes = codes_[slot];
    if (codes.numel < s.codes || codes.dtype != dtype) {
      if (codes) ops_.release(codes);
      codes = ops_.alloc(s.codes, dtype);
    }
    meta(Slot(slot), rowwise_ ? static_cast<int>(s.scales) : 1);
  }
}

void Fp8Linear::check_gpu_shapes(size_t N, const std::vector<Shape>& shapes) {
  const auto need = [](size_t v, const std::string& what) {
    if (v % 16 != 0)
      throw ConfigError("precision.fp8: the GPU's FP8 products need multiples of 16, but " + what + " is " +
                        std::to_string(v) + " (set precision.fp8_layers to leave that layer out, or change the shape)");
  };
  if (!shapes.empty())
    need(N, "the tokens of a micro-batch on this rank (batch.micro_batch_size x batch.seq_len / parallel.cp)");
  for (const Shape& s : shapes) {
    if (s.rows > 0) need(s.rows, "the rows of one LM head chunk");
    need(s.in, "a layer's input width on this rank");
    need(s.out, "a layer's output width on this rank");
  }
}

Tensor Fp8Linear::meta(Slot slot, int len) {
  const size_t n = meta_floats(size_t(len), tp_.size(), cp_ ? cp_->size() : 1);
  Tensor& m = meta_[slot];
  if (m.numel < n) {
    if (m) ops_.release(m);
    m = ops_.alloc(n, DType::f32);
  }
  return m;
}

void Fp8Linear::set_delayed(Fp8Delayed* state) {
  check(!(state && rowwise_), "Fp8Linear: delayed scaling is tensorwise (one scale per tensor), not rowwise");
  delayed_ = state;
}

void Fp8Linear::record_only(Tensor t, int rows, int cols, Fp8Site site, Fp8Delayed::Operand o) {
  check(delayed_ != nullptr, "Fp8Linear::record_only without delayed scaling");
  const Slot slot = o == Fp8Delayed::kDout ? kDout : o == Fp8Delayed::kW ? kW : kX;
  const Fp8Format f = o == Fp8Delayed::kDout ? grad_ : Fp8Format::e4m3;
  quantize(slot, t, rows, cols, false, f, gather_amax(slot, t, rows, cols, false, {}), record(site, o));
}

Fp8Linear::Amaxes Fp8Linear::scale_amaxes(Slot slot, Fp8Site site, Fp8Delayed::Operand o, Tensor t, int rows,
                                          int cols, bool transpose, Split split) {
  if (delayed_ && delayed_->has_history()) return {delayed_->scale_amax(site.index, o), 1, 1};
  return gather_amax(slot, t, rows, cols, transpose, split);
}

Tensor Fp8Linear::record(Fp8Site site, Fp8Delayed::Operand o) const {
  return delayed_ ? delayed_->record(site.index, o) : Tensor{};
}

Fp8Linear::Amaxes Fp8Linear::gather_amax(Slot slot, Tensor t, int rows, int cols, bool transpose, Split split) {
  // Tensorwise: one amax over everything. Rowwise: one per row of the operand (t's rows, or its
  // columns when it goes in transposed), running over the other dimension, K.
  const Fp8Amax over = !rowwise_ ? Fp8Amax::tensor : transpose ? Fp8Amax::cols : Fp8Amax::rows;
  const int len = over == Fp8Amax::tensor ? 1 : over == Fp8Amax::rows ? rows : cols;
  const bool runs_down_rows = over != Fp8Amax::rows, runs_along_cols = over != Fp8Amax::cols;
  const bool over_tp = tp_.size() > 1 && ((runs_down_rows && split.rows_tp) || (runs_along_cols && split.cols_tp));
  const bool over_cp = cp_ && runs_down_rows && split.rows_cp;
  // The amaxes as a cp x tp grid of blocks of len: this rank writes its own block, then an
  // in-place all-gather over tp fills its cp row, and one over cp (rows as blocks) the rest, so
  // the grid ends the same on every rank.
  const int tp_n = over_tp ? tp_.size() : 1, tp_r = over_tp ? tp_.rank() : 0;
  const int cp_n = over_cp ? cp_->size() : 1, cp_r = over_cp ? cp_->rank() : 0;
  const size_t L = size_t(len), scales = (L + 3) / 4 * 4;
  const Tensor grid = meta(slot, len).slice(scales, size_t(tp_n) * cp_n * L);
  const Tensor row = grid.slice(size_t(cp_r) * tp_n * L, size_t(tp_n) * L);
  const Tensor own = row.slice(size_t(tp_r) * L, L);
  ops_.fp8_amax(own, t, rows, cols, over);
  if (tp_n > 1) tp_.all_gather(own, row);
  if (cp_n > 1) cp_->all_gather(row, grid);
  return {grid, tp_n * cp_n, len};
}

Fp8Linear::Quantized Fp8Linear::quantize(Slot slot, Tensor t, int rows, int cols, bool transpose, Fp8Format f,
                                         const Amaxes& amax, Tensor record) {
  const size_t n = size_t(rows) * cols;
  Tensor& codes = codes_[slot];
  if (codes.numel < n || codes.dtype != fp8_dtype(f)) {
    if (codes) ops_.release(codes);
    codes = ops_.alloc(n, fp8_dtype(f));
  }
  const Quantized q{codes.slice(0, n), meta(slot, amax.len).slice(0, size_t(amax.len))};
  ops_.fp8_quantize(q.codes, q.scale_inv, t, amax.values, amax.count, rows, cols, transpose, rowwise_, record);
  return q;
}

void Fp8Linear::forward(Tensor out, Tensor x, bool x_split, Tensor w, Tensor bias, int N, int IC, int OC,
                        Fp8Site site) {
  using D = Fp8Delayed;
  // x: tokens over cp, features over tp in a row-parallel layer; w: a column-parallel layer's
  // rows, a row-parallel layer's columns over tp. Delayed scaling records x and w here, once.
  const Split xs{false, x_split, true}, ws{!x_split, x_split, false};
  const Quantized qx = quantize(kX, x, N, IC, false, Fp8Format::e4m3,
                                scale_amaxes(kX, site, D::kX, x, N, IC, false, xs), record(site, D::kX));
  const Quantized qw = quantize(kW, w, OC, IC, false, Fp8Format::e4m3,
                                scale_amaxes(kW, site, D::kW, w, OC, IC, false, ws), record(site, D::kW));
  ops_.fp8_matmul(out, qx.codes, qx.scale_inv, qw.codes, qw.scale_inv, bias, N, OC, IC, false, rowwise_);
}

void Fp8Linear::backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, bool dout_split, Tensor x,
                         bool x_split, Tensor w, int N, int IC, int OC, Fp8Site site) {
  using D = Fp8Delayed;
  // dout: tokens over cp, features over tp in a column-parallel layer (dout_split); w: as in
  // forward (a column-parallel layer is the one whose output gradient is split).
  const Split ds{false, dout_split, true}, ws{dout_split, !dout_split, false}, xs{false, x_split, true};
  // Tensorwise, dout's one scale serves both of its quantisations (plain for dinp, transposed
  // for dw); rowwise, each has its own rows. Delayed scaling records dout in the first of them
  // (x and w were recorded in forward).
  Amaxes dout_amax;
  if (!rowwise_ && (dinp || dw)) dout_amax = scale_amaxes(kDout, site, D::kDout, dout, N, OC, false, ds);
  if (dinp) {  // dinp [N, IC] = dout [N, OC] @ w [OC, IC]: K = OC, so w goes in as w^T [IC, OC]
    const Amaxes a = rowwise_ ? gather_amax(kDout, dout, N, OC, false, ds) : dout_amax;
    const Quantized qd = quantize(kDout, dout, N, OC, false, grad_, a, record(site, D::kDout));
    const Quantized qw = quantize(kWT, w, OC, IC, true, Fp8Format::e4m3,
                                  scale_amaxes(kWT, site, D::kW, w, OC, IC, true, ws), Tensor{});
    ops_.fp8_matmul(dinp, qd.codes, qd.scale_inv, qw.codes, qw.scale_inv, Tensor{}, N, IC, OC, false, rowwise_);
  }
  if (dw) {  // dw [OC, IC] += dout^T [OC, N] @ x [N, IC]: K = N, both transposed
    const Amaxes a = rowwise_ ? gather_amax(kDoutT, dout, N, OC, true, ds) : dout_amax;
    const Quantized qd = quantize(kDoutT, dout, N, OC, true, grad_, a, dinp ? Tensor{} : record(site, D::kDout));
    const Quantized qx = quantize(kXT, x, N, IC, true, Fp8Format::e4m3,
                                  scale_amaxes(kXT, site, D::kX, x, N, IC, true, xs), Tensor{});
    ops_.fp8_matmul(dw, qd.codes, qd.scale_inv, qx.codes, qx.scale_inv, Tensor{}, OC, IC, N, true, rowwise_);
  }
  if (dbias) ops_.matmul_backward(Tensor{}, Tensor{}, dbias, dout, Tensor{}, w, N, IC, OC);
}

}  // namespace pt
