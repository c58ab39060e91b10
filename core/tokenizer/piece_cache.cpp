#include "core/tokenizer/piece_cache.h"

#include <cstring>

namespace pt {

namespace {
constexpr size_t kInitialSlots = 1 << 12;
}  // namespace

PieceCache::PieceCache(size_t max_ids) : max_ids_(max_ids), slots_(kInitialSlots) {}

// FNV-1a, then a final mix so that the low bits (the slot index) depend on every byte.
uint64_t PieceCache::hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  return h ^ (h >> 32);
}

std::span<const int32_t> PieceCache::find(std::string_view piece) const {
  const uint64_t h = hash(piece);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.ids_size == 0) return {};
    if (s.hash == h && s.key_size == piece.size() && std::memcmp(keys_.data() + s.key_offset, piece.data(), piece.size()) == 0)
      return {ids_.data() + s.ids_offset, s.ids_size};
  }
}

void PieceCache::insert(std::string_view piece, std::span<const int32_t> ids) {
  if (ids.empty()) return;
  // Offsets are 32-bit: clear well before they could overflow.
  if (ids_.size() + ids.size() > max_ids_ || keys_.size() + piece.size() > 0xFFFFFFFFu / 2) clear();
  if (2 * (used_ + 1) > slots_.size()) grow();
  const uint64_t h = hash(piece);
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  while (slots_[i].ids_size != 0) i = (i + 1) & mask;
  slots_[i] = Slot{h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(piece.size()),
                   static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(ids.size())};
  keys_.append(piece);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++used_;
}

void PieceCache::clear() {
  slots_.assign(kInitialSlots, Slot{});
  used_ = 0;
  keys_.clear();
  ids_.clear();
}

void PieceCache::grow() {
  std::vector<Slot> old(slots_.size() * 2);
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.ids_size == 0) continue;
    size_t i = s.hash & mask;
    while (slots_[i].ids_size != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

}  // namespace pt
