#include "core/parallel/fp8_delayed.h"

#include <algorithm>

namespace pt {

namespace {
// The larger group's size when some group has several ranks (end_step gathers its rows), else 0.
int gathered_rows(int tp, int dp_cp) { return std::max(tp, dp_cp) > 1 ? std::max(tp, dp_cp) : 0; }
}  // namespace

size_t Fp8Delayed::bytes(int sites, int history, int tp, int dp_cp) {
  const size_t S = size_t(std::max(sites, 1)) * kOperands;
  return sizeof(float) * S * (2 + size_t(history) + size_t(gathered_rows(tp, dp_cp)));
}

Fp8Delayed::Fp8Delayed(Ops& ops, int sites, int history, Comm& tp, Comm* dp_cp)
    : ops_(ops), sites_(sites), history_(history), tp_(tp), dp_cp_(dp_cp) {
  check(sites >= 0 && history >= 1, "Fp8Delayed: needs sites >= 0 and a history of at least one step");
  const size_t S = size_t(std::max(sites, 1)) * kOperands;
  records_ = ops_.alloc(S, DType::f32);
  history_rows_ = ops_.alloc(size_t(history) * S, DType::f32);
  scale_amaxes_ = ops_.alloc(S, DType::f32);
  if (const int rows = gathered_rows(tp.size(), dp_cp ? dp_cp->size() : 1); rows > 0)
    gathered_ = ops_.alloc(size_t(rows) * S, DType::f32);
  ops_.zero(records_);
  ops_.zero(history_rows_);
  ops_.zero(scale_amaxes_);
}

Fp8Delayed::~Fp8Delayed() {
  for (Tensor* t : {&records_, &history_rows_, &scale_amaxes_, &gathered_})
    if (*t) ops_.release(*t);
}

size_t Fp8Delayed::slot(int site, Operand o) const {
  check(site >= 0 && site < sites_, "Fp8Delayed: site " + std::to_string(site) + " of " + std::to_string(sites_));
  return size_t(site) * kOperands + o;
}

Tensor Fp8Delayed::scale_amax(int site, Operand o) const { return scale_amaxes_.slice(slot(site, o), 1); }
Tensor Fp8Delayed::record(int site, Operand o) const { return records_.slice(slot(site, o), 1); }

void Fp8Delayed::begin_step() { ops_.zero(records_); }

void Fp8Delayed::end_step(bool keep) {
  if (!keep || sites_ == 0) return;
  const size_t S = size_t(sites_) * kOperands;
  const Tensor records = records_.slice(0, S);
  // The max over each group: gather every rank's records as rows, then each column's largest.
  for (Comm* group : {&tp_, dp_cp_}) {
    const int n = group ? group->size() : 1;
    if (n == 1) continue;
    const Tensor rows = gathered_.slice(0, size_t(n) * S);
    group->all_gather(records, rows);
    ops_.fp8_amax(records, rows, n, int(S), Fp8Amax::cols);
  }
  ops_.copy(history_rows_.slice(size_t(next_) * S, S), records, S);
  next_ = (next_ + 1) % history_;
  recorded_ = true;
  recompute_scale_amaxes();
}

void Fp8Delayed::recompute_scale_amaxes() {
  const size_t S = size_t(sites_) * kOperands;
  if (S > 0) ops_.fp8_amax(scale_amaxes_.slice(0, S), history_rows_.slice(0, size_t(history_) * S), history_, int(S), Fp8Amax::cols);
}

std::vector<std::vector<float>> Fp8Delayed::histories() const {
  const size_t S = size_t(sites_) * kOperands;
  std::vector<float> all(size_t(history_) * S);
  if (S > 0) ops_.download(all.data(), DType::f32, history_rows_.slice(0, all.size()), all.size());
  std::vector<std::vector<float>> out(static_cast<size_t>(sites_));
  for (int site = 0; site < sites_; site++) {
    out[size_t(site)].reserve(size_t(history_) * kOperands);
    for (int i = 0; i < history_; i++) {  // from the oldest row (next_) on
      const float* row = all.data() + size_t((next_ + i) % history_) * S + size_t(site) * kOperands;
      out[size_t(site)].insert(out[size_t(site)].end(), row, row + kOperands);
    }
  }
  return out;
}

void Fp8Delayed::restore(const std::vector<std::vector<float>>& rows) {
  const size_t S = size_t(sites_) * kOperands;
  std::vector<float> all(size_t(history_) * S, 0.0f);
  next_ = 0;
  recorded_ = false;
  if (!rows.empty()) {
    check(rows.size() == size_t(sites_), "Fp8Delayed::restore: " + std::to_string(rows.size()) + " histories for " +
                                             std::to_string(sites_) + " sites");
    // The newest rows fill the history from its end, so row 0 (next_) stays the oldest.
    for (int site = 0; site < sites_; site++) {
      const std::vector<float>& r = rows[site];
      check(r.size() % kOperands == 0, "Fp8Delayed::restore: a history of " + std::to_string(r.size()) +
                                           " floats is not rows of " + std::to_string(int(kOperands)));
      const size_t n = r.size() / kOperands, keep = std::min(n, size_t(history_));
      for (size_t i = 0; i < keep; i++) {
        const float* src = r.data() + (n - keep + i) * kOperands;
        std::copy(src, src + kOperands, all.data() + (history_ - keep + i) * S + size_t(site) * kOperands);
      }
    }
    recorded_ = true;  // scales from now on come from the history
  }
  if (S > 0) ops_.upload(history_rows_.slice(0, all.size()), all.data(), DType::f32, all.size());
  ops_.zero(records_);
  recompute_scale_amaxes();
}

}  // namespace pt
