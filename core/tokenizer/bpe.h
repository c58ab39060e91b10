// Byte-pair encoding: the merge table and the merge loop of GPT-2's encoder.py.
//
// GPT-2's loop: while some adjacent pair of symbols has a rank, take the pair with the lowest
// rank and merge all of its occurrences, left to right and non-overlapping; then look again.
// bpe_merge() gives exactly that result in O(n log n) rather than O(n^2): the candidate pairs sit
// in a heap ordered by (rank, position), all occurrences of one rank are merged in position order,
// and the pairs that those merges create are only added once the rank is done, just as GPT-2
// only sees them on its next look. This keeps long pieces (a megabyte of spaces) cheap.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pt {

// (left id, right id) -> (rank, merged id). Open addressing over a flat array: the merge loop
// looks pairs up constantly, and std::unordered_map's node per entry made those lookups cache
// misses (perf, on the offline corpus).
class MergeTable {
 public:
  struct Merge {
    int32_t rank;    // position in vocab.bpe: lower merges first
    int32_t merged;  // the token the pair becomes
  };

  // A later add() of the same pair replaces the earlier one (as a Python dict built from the list).
  // Ids must be in [0, 2^31).
  void add(int32_t left, int32_t right, int32_t merged, int32_t rank);
  const Merge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    for (size_t i = index(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // never a key: ids are non-negative
  static uint64_t key(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
  size_t index(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  void grow();

  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

// Scratch space of bpe_merge, kept between calls so that the loop does not allocate.
struct BpeScratch {
  struct Candidate {
    int32_t rank;
    int32_t pos;  // index of the pair's left symbol
    int32_t left, right;
  };
  std::vector<int32_t> next, prev;
  std::vector<Candidate> heap, created;
};

// Merges `symbols` (token ids, initially one per byte) in place.
void bpe_merge(const MergeTable& merges, std::vector<int32_t>& symbols, BpeScratch& scratch);

}  // namespace pt
