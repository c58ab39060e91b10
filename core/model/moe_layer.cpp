#include "core/model/moe_layer.h"

#include <algorithm>

#include "core/common/error.h"
#include "core/dist/local_comm.h"

namespace pt {

namespace {
// The rows of the experts' side (every routed row of the ep group), rounded up to 16: the most
// rows one expert's padded weight-gradient product takes.
size_t padded_rows(int rows, int k, int ep) { return (size_t(rows) * k * ep + 15) / 16 * 16; }
// An expert's two products: up [2H, C] and down [C, H].
std::vector<Fp8Linear::Shape> expert_shapes(int H, int C) {
  return {{size_t(C), size_t(2) * H}, {size_t(H), size_t(C)}};
}
}  // namespace

MoeLayer::MoeLayer(Ops& ops, const Architecture& a, int rows, int layers, int slots,
                   std::vector<Comm*> token_groups, Comm* grad_group, const Alloc& alloc, Comm* ep_group)
    : ops_(ops),
      E_(a.n_experts),
      k_(a.top_k),
      H_(a.expert_hidden),
      C_(a.d_model),
      rows_(rows),
      token_groups_(std::move(token_groups)),
      grad_group_(grad_group),
      ep_(ep_group && ep_group->size() > 1 ? ep_group : nullptr),
      layers_(layers) {
  check(E_ >= 1 && k_ >= 1 && k_ <= E_ && H_ >= 1, "MoeLayer: an architecture without experts");
  ep_size_ = ep_ ? ep_->size() : 1;
  check(E_ % ep_size_ == 0, "MoeLayer: expert parallel over " + std::to_string(ep_size_) + " ranks needs n_experts=" +
                                std::to_string(E_) + " to divide by it");
  local_experts_ = E_ / ep_size_;
  first_expert_ = ep_ ? ep_->rank() * local_experts_ : 0;
  const DType act = ops.compute_dtype(), f32 = DType::f32, i32 = DType::i32;
  const size_t R = size_t(rows), RK = R * k_, cap = RK * ep_size_;  // cap: the experts' side
  kept_.resize(size_t(slots) * layers);
  for (Kept& s : kept_) {
    s.probs = alloc(R * E_, f32);
    s.topk_expert = alloc(RK, i32);
    s.topk_weight = alloc(RK, f32);
    s.slot_of = alloc(RK, i32);
    s.route_offsets = alloc(size_t(E_) + 1, i32);
    s.x_perm = alloc(RK * C_, act);
    s.y = alloc(RK * C_, act);
    s.dprobs_all = alloc(size_t(E_), f32);
    s.ex = ep_ ? alloc(cap * C_, act) : s.x_perm;
    s.eh = alloc(cap * 2 * H_, act);
    s.eact = alloc(cap * H_, act);
    s.ey = ep_ ? alloc(cap * C_, act) : s.y;
  }
  logits_ = alloc(R * E_, act);
  dlogits_ = alloc(R * E_, act);
  dy_ = alloc(RK * C_, act);
  dact_ = alloc(cap * H_, act);
  dh_ = alloc(cap * 2 * H_, act);
  dx_perm_ = alloc(RK * C_, act);
  dweight_ = alloc(RK, f32);
  dx_router_ = alloc(R * C_, act);
  balance_sums_ = alloc(2 * size_t(E_) + 1, f32);
  stats_sums_ = alloc(2, f32);
  ops_.zero(stats_sums_);
  if (grad_group_) grad_sum_ = alloc(size_t(E_) * C_ + size_t(local_experts_) * 3 * H_ * C_, f32);
  if (ep_) {
    send_ = alloc(cap * C_, act);
    recv_ = alloc(cap * C_, act);
    counts_ = alloc(size_t(E_), f32);
    all_counts_ = alloc(size_t(E_) * ep_size_, f32);
    edy_ = alloc(cap * C_, act);
    edx_ = alloc(cap * C_, act);
  }
}

// What the constructor allocates, per kept set and shared (f32 and i32 are 4 bytes each).
size_t MoeLayer::kept_bytes(int E, int k, int H, int C, int rows, DType act, int ep) {
  const size_t R = size_t(rows), RK = R * k, cap = RK * ep, s = dtype_size(act);
  // probs, dprobs_all (f32); topk_expert, topk_weight, slot_of; route_offsets; x_perm, y; the
  // experts' side (eh, eact; ex, ey of their own with expert parallel)
  return 4 * (R * E + size_t(E)) + 4 * 3 * RK + 4 * (size_t(E) + 1) + s * RK * 2 * size_t(C) +
         s * cap * 3 * size_t(H) +
         (ep > 1 ? s * cap * 2 * size_t(C) : 0);
}

size_t MoeLayer::scratch_bytes(int E, int k, int H, int C, int rows, DType act, bool grad_group, int ep) {
  const size_t R = size_t(rows), RK = R * k, cap = RK * ep, s = dtype_size(act);
  // logits, dlogits, dy, dx_perm, dx_router; dact, dh (the experts' side); dweight, the balancing
  // sums and the stats' sums (f32); the partial gradients (f32); expert parallel: send, recv, edy,
  // edx, the counts (f32)
  return s * (2 * R * E + RK * 2 * size_t(C) + R * C) + s * cap * 3 * size_t(H) + 4 * RK + 4 * (2 * size_t(E) + 3) +
         (grad_group ? 4 * (size_t(E) * C + size_t(E / ep) * 3 * H * C) : 0) +
         (ep > 1 ? s * cap * 4 * size_t(C) + 4 * size_t(E) * (1 + ep) : 0);
}

void MoeLayer::enable_fp8(Fp8Delayed* state, const Fp8Sites& sites, Fp8Format grad_format, const Alloc& alloc) {
  check(state != nullptr, "MoeLayer::enable_fp8: the routed experts' FP8 needs delayed scaling");
  check(sites.experts == E_ && sites.sparse == layers_, "MoeLayer::enable_fp8: sites for " +
                                                           std::to_string(sites.sparse) + " sparse blocks of " +
                                                           std::to_string(sites.experts) + " experts");
  // The GPU's FP8 products take widths that are multiples of 16 (the rows are padded to 16).
  if (ops_.device() == Device::cuda) Fp8Linear::check_gpu_shapes(16, expert_shapes(H_, C_));
  fp8_group_ = std::make_unique<LocalComm>(0, ops_);
  fp8_ = std::make_unique<Fp8Linear>(ops_, *fp8_group_, nullptr, grad_format);
  fp8_->set_delayed(state);
  fp8_state_ = state;
  fp8_sites_ = sites;
  const size_t cap16 = padded_rows(rows_, k_, ep_size_);
  pad_x_ = alloc(cap16 * std::max(C_, H_), ops_.compute_dtype());
  pad_dout_ = alloc(cap16 * std::max(C_, 2 * H_), ops_.compute_dtype());
  // The products' scratch at its largest now (an expert may get every row of the experts' side),
  // so that what the layer holds does not depend on the routing.
  fp8_->reserve(cap16, expert_shapes(H_, C_));
}

size_t MoeLayer::fp8_products_bytes() const {
  return fp8_ ? Fp8Linear::scratch_bytes(padded_rows(rows_, k_, ep_size_), expert_shapes(H_, C_), 1, 1, false) : 0;
}

size_t MoeLayer::fp8_scratch_bytes(int k, int H, int C, int rows, DType act, int ep) {
  const size_t cap16 = padded_rows(rows, k, ep);
  const size_t pads = dtype_size(act) * cap16 * (size_t(std::max(C, H)) + size_t(std::max(C, 2 * H)));
  return pads + Fp8Linear::scratch_bytes(cap16, expert_shapes(H, C), 1, 1, false);
}

Fp8Site MoeLayer::expert_site(int layer, int local_expert, bool down) const {
  if (!fp8_) return {};
  return {fp8_sites_.expert(layer, first_expert_ + local_expert, down)};
}

Tensor MoeLayer::padded(Tensor pad, Tensor src, int m, int m16, int cols) {
  const size_t n = size_t(m) * cols;
  ops_.copy(pad.slice(0, n), src, n);
  ops_.zero(pad.slice(n, size_t(m16 - m) * cols));
  return pad.slice(0, size_t(m16) * cols);
}

void MoeLayer::expert_forward(Tensor out, Tensor x, Tensor w, int m, int IC, int OC, Fp8Site site) {
  if (site.on() && fp8_state_->has_history()) {
    fp8_->forward(out, x, false, w, Tensor{}, m, IC, OC, site);
    return;
  }
  ops_.matmul_forward(out, x, w, Tensor{}, m, IC, OC);
  if (site.on()) {  // the first step: only the amaxes, for the next step's scales
    fp8_->record_only(x, m, IC, site, Fp8Delayed::kX);
    fp8_->record_only(w, OC, IC, site, Fp8Delayed::kW);
  }
}

void MoeLayer::expert_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor x, Tensor w, int m, int IC, int OC,
                               Fp8Site site) {
  if (!site.on() || !fp8_state_->has_history()) {
    ops_.matmul_backward(dinp, dw, Tensor{}, dout, x, w, m, IC, OC);
    if (site.on()) fp8_->record_only(dout, m, OC, site, Fp8Delayed::kDout);
    return;
  }
  const int m16 = (m + 15) / 16 * 16;
  if (m16 == m) {
    fp8_->backward(dinp, dw, Tensor{}, dout, false, x, false, w, m, IC, OC, site);
    return;
  }
  // The weight gradient's inner dimension is the rows: padded to 16 with zero rows.
  fp8_->backward(dinp, Tensor{}, Tensor{}, dout, false, x, false, w, m, IC, OC, site);
  fp8_->backward(Tensor{}, dw, Tensor{}, padded(pad_dout_, dout, m, m16, OC), false, padded(pad_x_, x, m, m16, IC),
                 false, w, m16, IC, OC, site);
}

MoeLayer::Kept& MoeLayer::kept(int slot, int layer) {
  const size_t i = size_t(slot) * layers_ + size_t(layer);
  check(layer >= 0 && layer < layers_ && i < kept_.size(), "MoeLayer: slot or layer out of range");
  return kept_[i];
}

// The all-to-all's layout: block r of the send buffer holds this rank's rows for rank r's experts
// (in permuted order, so they are contiguous), padded to `block` rows; block r of the receive
// buffer holds rank r's rows for this rank's experts, expert by expert. The experts' side groups
// them by this rank's expert, then by source rank.
MoeLayer::Exchange MoeLayer::plan_exchange(const std::vector<float>& all, const std::vector<int>& route_offsets,
                                           std::vector<int>& offsets) const {
  const int E = E_, L = local_experts_;
  auto count = [&](int src, int e) { return static_cast<size_t>(all[size_t(src) * E + e]); };
  Exchange x;
  for (int src = 0; src < ep_size_; src++)
    for (int dst = 0; dst < ep_size_; dst++) {
      size_t rows = 0;
      for (int e = dst * L; e < (dst + 1) * L; e++) rows += count(src, e);
      x.block = std::max(x.block, static_cast<int>(rows));
    }
  for (int dst = 0; dst < ep_size_; dst++) {
    const size_t first = size_t(route_offsets[size_t(dst) * L]), end = size_t(route_offsets[size_t(dst + 1) * L]);
    x.sent.push_back({size_t(dst) * x.block, first, end - first});
  }
  std::vector<size_t> next_in_block(size_t(ep_size_), 0);
  offsets.assign(size_t(L) + 1, 0);
  size_t at = 0;
  for (int e = 0; e < L; e++) {
    for (int src = 0; src < ep_size_; src++) {
      const size_t n = count(src, first_expert_ + e);
      x.received.push_back({size_t(src) * x.block + next_in_block[size_t(src)], at, n});
      next_in_block[size_t(src)] += n;
      at += n;
    }
    offsets[size_t(e) + 1] = static_cast<int>(at);
  }
  return x;
}

void MoeLayer::copy_runs(const std::vector<Run>& runs, Tensor blocks, Tensor rows, bool into_blocks) {
  const size_t C = size_t(C_);
  for (const Run& r : runs) {
    if (r.rows == 0) continue;
    const Tensor b = blocks.slice(r.block_row * C, r.rows * C), x = rows.slice(r.row * C, r.rows * C);
    if (into_blocks) ops_.copy(b, x, r.rows * C);
    else ops_.copy(x, b, r.rows * C);
  }
}

void MoeLayer::to_experts(Tensor expert_rows, Tensor permuted, const Exchange& x) {
  if (!ep_) return;  // the same buffer
  const size_t n = size_t(ep_size_) * x.block * C_;
  copy_runs(x.sent, send_, permuted, true);
  ep_->all_to_all(send_.slice(0, n), recv_.slice(0, n));
  copy_runs(x.received, recv_, expert_rows, false);
}

// The way back: block r of send_ then holds what this rank sent rank r, processed.
void MoeLayer::from_experts(Tensor permuted, Tensor expert_rows, const Exchange& x) {
  if (!ep_) return;
  const size_t n = size_t(ep_size_) * x.block * C_;
  copy_runs(x.received, recv_, expert_rows, true);
  ep_->all_to_all(recv_.slice(0, n), send_.slice(0, n));
  copy_runs(x.sent, send_, permuted, false);
}

void MoeLayer::run_experts(int layer, const Kept& s, const MoeParams& p) {
  const int H = H_, C = C_;
  if (grouped()) {  // every expert in one product each, their rows told by the device's offsets
    ops_.grouped_matmul_forward(s.eh, s.ex, p.up, s.route_offsets, E_, s.rows, C, 2 * H);
    ops_.swiglu_forward(s.eact, s.eh, s.rows, H);
    ops_.grouped_matmul_forward(s.ey, s.eact, p.down, s.route_offsets, E_, s.rows, H, C);
    return;
  }
  for (int e = 0; e < local_experts_; e++) {
    const int r0 = s.offsets[size_t(e)], m = s.offsets[size_t(e) + 1] - r0;
    const size_t g = size_t(e);  // p holds this rank's experts only
    const Tensor up = p.up.slice(g * 2 * H * C, size_t(2) * H * C);
    const Tensor down = p.down.slice(g * C * H, size_t(C) * H);
    if (m == 0) {  // an idle expert still records its weights, so that their scales are ready when chosen
      if (fp8_) {
        fp8_->record_only(up, 2 * H, C, expert_site(layer, e, false), Fp8Delayed::kW);
        fp8_->record_only(down, C, H, expert_site(layer, e, true), Fp8Delayed::kW);
      }
      continue;
    }
    const Tensor h = s.eh.slice(size_t(r0) * 2 * H, size_t(m) * 2 * H);
    const Tensor act = s.eact.slice(size_t(r0) * H, size_t(m) * H);
    expert_forward(h, s.ex.slice(size_t(r0) * C, size_t(m) * C), up, m, C, 2 * H, expert_site(layer, e, false));
    ops_.swiglu_forward(act, h, m, H);
    expert_forward(s.ey.slice(size_t(r0) * C, size_t(m) * C), act, down, m, H, C, expert_site(layer, e, true));
  }
}

void MoeLayer::experts_backward(int layer, const Kept& s, Tensor dy_rows, Tensor dx_rows, const MoeParams& p,
                                const MoeParams& g) {
  const int H = H_, C = C_;
  if (grouped()) {
    ops_.grouped_matmul_backward(dact_, g.down, dy_rows, s.eact, p.down, s.route_offsets, E_, s.rows, H, C);
    ops_.swiglu_backward(dh_, s.eh, dact_, s.rows, H);
    ops_.grouped_matmul_backward(dx_rows, g.up, dh_, s.ex, p.up, s.route_offsets, E_, s.rows, C, 2 * H);
    return;
  }
  for (int e = 0; e < local_experts_; e++) {
    const int r0 = s.offsets[size_t(e)], m = s.offsets[size_t(e) + 1] - r0;
    if (m == 0) continue;
    const size_t ge = size_t(e), up_at = ge * 2 * H * C, down_at = ge * C * H;
    const Tensor h = s.eh.slice(size_t(r0) * 2 * H, size_t(m) * 2 * H);
    const Tensor dh = dh_.slice(size_t(r0) * 2 * H, size_t(m) * 2 * H);
    const Tensor act = s.eact.slice(size_t(r0) * H, size_t(m) * H);
    const Tensor dact = dact_.slice(size_t(r0) * H, size_t(m) * H);
    expert_backward(dact, g.down.slice(down_at, size_t(C) * H), dy_rows.slice(size_t(r0) * C, size_t(m) * C), act,
                    p.down.slice(down_at, size_t(C) * H), m, H, C, expert_site(layer, e, true));
    ops_.swiglu_backward(dh, h, dact, m, H);
    expert_backward(dx_rows.slice(size_t(r0) * C, size_t(m) * C), g.up.slice(up_at, size_t(2) * H * C), dh,
                    s.ex.slice(size_t(r0) * C, size_t(m) * C), p.up.slice(up_at, size_t(2) * H * C), m, C, 2 * H,
                    expert_site(layer, e, false));
  }
}

void MoeLayer::forward(int slot, int layer, Tensor out, Tensor x, int n, const MoeParams& p, float aux_weight,
                       bool training) {
  check(n >= 1 && n <= rows_, "MoeLayer::forward: " + std::to_string(n) + " rows of at most " + std::to_string(rows_));
  Kept& s = kept(slot, layer);
  const int E = E_, k = k_, C = C_;
  ops_.matmul_forward(logits_, x, p.router, Tensor{}, n, C, E);
  ops_.moe_router_forward(s.probs, s.topk_expert, s.topk_weight, logits_, n, E, k);
  // The routing plan where the choices are: the host never waits for them on the grouped path.
  ops_.moe_route(s.slot_of, s.route_offsets, s.topk_expert, n, k, E);
  s.rows = n * k;
  if (training && record_routing_) {
    const size_t at = stats_.routing.size();
    stats_.routing.resize(at + size_t(n) * k);
    ops_.download(stats_.routing.data() + at, DType::i32, s.topk_expert, size_t(n) * k);
  }
  balancing_loss(s, n, aux_weight, training);
  ops_.moe_permute(s.x_perm, x, s.slot_of, n, C, k);

  if (!grouped()) {  // the per-expert products and the all-to-all are sized on the host
    std::vector<int> route(size_t(E) + 1);
    ops_.download(route.data(), DType::i32, s.route_offsets, route.size());
    if (!ep_) {
      s.offsets = route;
    } else {
      // Every rank's counts, so each knows what it receives and how large the blocks must be.
      std::vector<float> mine(static_cast<size_t>(E));
      for (int e = 0; e < E; e++) mine[size_t(e)] = static_cast<float>(route[size_t(e) + 1] - route[size_t(e)]);
      ops_.upload(counts_, mine.data(), DType::f32, mine.size());
      ep_->all_gather(counts_, all_counts_);
      std::vector<float> all(size_t(E) * ep_size_);
      ops_.download(all.data(), DType::f32, all_counts_, all.size());
      s.xchg = plan_exchange(all, route, s.offsets);
      to_experts(s.ex, s.x_perm, s.xchg);
    }
  }
  run_experts(layer, s, p);
  from_experts(s.y, s.ey, s.xchg);
  ops_.moe_combine(out, s.y, s.topk_weight, s.slot_of, n, C, k);
}

// The load-balancing loss over the whole micro-batch, on the device: this rank's counts and
// probability sums, summed over every rank holding the micro-batch's tokens, give aux (added to
// the stats when training) and its gradient, s.dprobs_all, for backward.
void MoeLayer::balancing_loss(Kept& s, int n, float aux_weight, bool training) {
  ops_.moe_balance_sums(balance_sums_, s.probs, s.route_offsets, n, E_);
  for (Comm* g : token_groups_)
    if (g) g->all_reduce(balance_sums_);
  ops_.moe_balance_loss(s.dprobs_all, training ? stats_sums_ : Tensor{}, balance_sums_, E_, k_, aux_weight);
  if (training) stats_.layer_batches += 1;
}

void MoeLayer::backward(int slot, int layer, Tensor dx, Tensor dout, Tensor x, int n, const MoeParams& p,
                        const MoeParams& g_in) {
  Kept& s = kept(slot, layer);
  const int E = E_, k = k_, H = H_, C = C_;
  // Under sequence parallel the gradients of this rank's rows are summed over tp before they
  // join the parameters' (which may hold earlier micro-batches, summed already).
  MoeParams g = g_in;
  const size_t L = size_t(local_experts_);
  const size_t n_router = size_t(E) * C, n_up = L * 2 * H * C, n_down = L * C * H;
  if (grad_group_) {
    ops_.zero(grad_sum_);
    g = {grad_sum_.slice(0, n_router), grad_sum_.slice(n_router, n_up), grad_sum_.slice(n_router + n_up, n_down)};
  }
  ops_.moe_combine_backward(dy_, dweight_, dout, s.y, s.topk_weight, s.slot_of, n, C, k);
  // The experts' side: with expert parallel the output gradients travel to the experts' ranks
  // and the input gradients back, as the rows did in forward.
  const Tensor edy = ep_ ? edy_ : dy_, edx = ep_ ? edx_ : dx_perm_;
  to_experts(edy, dy_, s.xchg);
  experts_backward(layer, s, edy, edx, p, g);
  from_experts(dx_perm_, edx, s.xchg);
  ops_.moe_permute_backward(dx, dx_perm_, s.slot_of, n, C, k);
  ops_.moe_router_backward(dlogits_, s.probs, s.topk_expert, s.topk_weight, dweight_, s.dprobs_all, n, E, k);
  ops_.matmul_backward(dx_router_, g.router, Tensor{}, dlogits_, x, p.router, n, C, E);
  ops_.add(dx, dx, dx_router_, size_t(n) * C);
  if (grad_group_) {
    grad_group_->all_reduce(grad_sum_);
    ops_.add(g_in.router, g_in.router, g.router, n_router);
    ops_.add(g_in.up, g_in.up, g.up, n_up);
    ops_.add(g_in.down, g_in.down, g.down, n_down);
  }
}

MoeStats MoeLayer::take_stats() {
  // The device's sums since the last take: one download a step, not one a layer.
  float sums[2];
  ops_.download(sums, DType::f32, stats_sums_, 2);
  ops_.zero(stats_sums_);
  MoeStats s = stats_;
  s.aux_sum = sums[0];
  s.max_load_sum = sums[1];
  stats_ = {};
  return s;
}

}  // namespace pt
