#include "core/tokenizer/bpe.h"

#include <algorithm>

namespace pt {

void MergeTable::add(int32_t left, int32_t right, int32_t merged, int32_t rank) {
  if (2 * (size_ + 1) > slots_.size()) grow();  // at most half full: short probe runs
  const uint64_t k = key(left, right);
  size_t i = index(k);
  while (slots_[i].key != kEmpty && slots_[i].key != k) i = (i + 1) & mask_;
  if (slots_[i].key == kEmpty) ++size_;
  slots_[i] = Slot{k, Merge{rank, merged}};
}

void MergeTable::grow() {
  std::vector<Slot> old(std::max<size_t>(1024, slots_.size() * 2), Slot{kEmpty, {}});
  old.swap(slots_);
  mask_ = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    size_t i = index(s.key);
    while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

void bpe_merge(const MergeTable& merges, std::vector<int32_t>& symbols, BpeScratch& s) {
  const auto n = static_cast<int32_t>(symbols.size());
  if (n < 2) return;
  // Symbols form a linked list over their original positions; a merge keeps the left one.
  s.next.resize(n);
  s.prev.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    s.next[i] = i + 1 < n ? i + 1 : -1;
    s.prev[i] = i - 1;
  }
  // std::*_heap build a max-heap: "later" means a higher rank, then a position further right.
  auto later = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  s.heap.clear();
  auto push_pair = [&](int32_t pos, std::vector<BpeScratch::Candidate>& into) {
    if (pos < 0 || s.next[pos] < 0) return;
    const int32_t l = symbols[pos], r = symbols[s.next[pos]];
    if (const MergeTable::Merge* m = merges.find(l, r)) into.push_back({m->rank, pos, l, r});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i, s.heap);
  std::make_heap(s.heap.begin(), s.heap.end(), later);

  while (!s.heap.empty()) {
    const int32_t rank = s.heap.front().rank;
    s.created.clear();
    while (!s.heap.empty() && s.heap.front().rank == rank) {
      std::pop_heap(s.heap.begin(), s.heap.end(), later);
      const BpeScratch::Candidate c = s.heap.back();
      s.heap.pop_back();
      // Stale when an earlier merge consumed either symbol or changed it.
      const int32_t right = s.next[c.pos];
      if (right < 0 || symbols[c.pos] != c.left || symbols[right] != c.right) continue;
      symbols[c.pos] = merges.find(c.left, c.right)->merged;
      symbols[right] = -1;  // consumed: also makes any candidate starting at it stale
      s.next[c.pos] = s.next[right];
      if (s.next[right] >= 0) s.prev[s.next[right]] = c.pos;
      s.next[right] = -1;
      push_pair(s.prev[c.pos], s.created);
      push_pair(c.pos, s.created);
    }
    for (const auto& c : s.created) {
      s.heap.push_back(c);
      std::push_heap(s.heap.begin(), s.heap.end(), later);
    }
  }
  // Compact the survivors in order.
  int32_t out = 0;
  for (int32_t i = 0; i >= 0; i = s.next[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

}  // namespace pt
