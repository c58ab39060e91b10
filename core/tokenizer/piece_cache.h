// The per-thread cache of BPE results, piece bytes -> token ids, as GPT-2's encoder keeps one:
// most pieces of a corpus are words that recur, so most cost one lookup instead of a merge loop.
//
// An open-addressing table (linear probing, power-of-two size, at most half full) over two flat
// arenas, one for the piece bytes and one for the ids: a lookup touches one slot and the bytes it
// compares, where std::unordered_map chases a node pointer per probe. It was the single largest
// cost of encoding with unordered_map (perf, on the offline corpus).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pt {

class PieceCache {
 public:
  // Drops everything once this many ids are held, so that a corpus of endless distinct pieces
  // (numbers, hashes) cannot grow it without bound. Frequent pieces come back at once.
  explicit PieceCache(size_t max_ids = size_t{1} << 24);

  // The cached ids of `piece`, or an empty span.
  std::span<const int32_t> find(std::string_view piece) const;
  void insert(std::string_view piece, std::span<const int32_t> ids);
  size_t size() const { return used_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0, key_size = 0;
    uint32_t ids_offset = 0, ids_size = 0;  // ids_size 0: the slot is empty (a piece has >= 1 id)
  };
  static uint64_t hash(std::string_view s);
  void clear();
  void grow();

  size_t max_ids_;
  std::vector<Slot> slots_;
  size_t used_ = 0;
  std::string keys_;
  std::vector<int32_t> ids_;
};

}  // namespace pt
