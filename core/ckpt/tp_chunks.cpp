#include "core/ckpt/tp_chunks.h"

#include <algorithm>

namespace pt::ckpt {

std::vector<GlobalSpan> global_spans(const TpSlice& tp, size_t begin, size_t end) {
  std::vector<GlobalSpan> spans;
  if (begin >= end) return spans;
  if (tp.whole()) return {GlobalSpan{begin, end - begin, begin, 0, 0}};
  const size_t r = tp.run();
  const auto contiguous = [&](size_t lo, size_t hi) { spans.push_back({lo, hi - lo, tp.global_index(lo), 0, 0}); };
  size_t i = begin;
  if (const size_t head_end = std::min(end, (begin + r - 1) / r * r); head_end > i) {
    contiguous(i, head_end);
    i = head_end;
  }
  if (const size_t body_end = std::max(i, end / r * r); body_end > i) {
    if (body_end - i == r) contiguous(i, body_end);
    else spans.push_back({i, body_end - i, tp.global_index(i), r, tp.stride()});
    i = body_end;
  }
  if (end > i) contiguous(i, end);
  return spans;
}

void read_local(CheckpointReader& r, const std::string& name, const TpSlice& tp, size_t begin, size_t end,
                float* out) {
  if (begin >= end) return;
  if (tp.whole()) return r.read(name, begin, end, out);
  // Local order is global order, so the extent runs from the first element's global index to
  // the last's; it holds the other ranks' elements in between, which are dropped.
  const uint64_t lo = tp.global_index(begin), hi = tp.global_index(end - 1) + 1;
  std::vector<float> extent(hi - lo);
  r.read(name, lo, hi, extent.data());
  tp.for_each_run(begin, end, [&](size_t local, size_t global, size_t n) {
    std::copy_n(extent.data() + (global - lo), n, out + (local - begin));
  });
}

}  // namespace pt::ckpt
