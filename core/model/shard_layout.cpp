#include "core/model/shard_layout.h"

#include <algorithm>

#include "core/common/error.h"

namespace pt {

namespace {

struct LayerRange {
  int layer;
  size_t begin, end;
};

// The table's layers in order, each a contiguous element range (ParamTable keeps them so).
std::vector<LayerRange> layer_ranges(const ParamTable& table) {
  std::vector<LayerRange> out;
  for (const auto& p : table.specs()) {
    if (!out.empty() && out.back().layer == p.layer) {
      out.back().end = p.offset + p.numel;
      continue;
    }
    check(out.empty() || p.layer > out.back().layer,
          "ShardLayout: parameter " + p.name + " of layer " + std::to_string(p.layer) +
              " is not contiguous with the rest of its layer in the ParamTable");
    out.push_back({p.layer, p.offset, p.offset + p.numel});
  }
  check(!out.empty(), "ShardLayout: the ParamTable is empty");
  return out;
}

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

size_t bucket_cap_elements(double grad_bucket_mb) {
  return std::max<size_t>(1, static_cast<size_t>(grad_bucket_mb * 1024 * 1024 / sizeof(float)));
}

ShardLayout::ShardLayout(const ParamTable& table, int zero_stage, int shard_count, int shard_rank, size_t bucket_cap)
    : table_(&table), stage_(zero_stage), shards_(zero_stage == 0 ? 1 : shard_count), rank_(zero_stage == 0 ? 0 : shard_rank) {
  check(zero_stage >= 0 && zero_stage <= 3, "ShardLayout: ZeRO stage " + std::to_string(zero_stage) + " is not 0..3");
  check(shards_ >= 1 && rank_ >= 0 && rank_ < shards_,
        "ShardLayout: shard rank " + std::to_string(rank_) + " of " + std::to_string(shards_) + " shards");
  const std::vector<LayerRange> layers = layer_ranges(table);
  first_layer_ = layers.front().layer;
  last_layer_ = layers.back().layer;
  held_.assign(static_cast<size_t>(last_layer_ - first_layer_ + 1), false);
  for (const LayerRange& r : layers) held_[static_cast<size_t>(r.layer - first_layer_)] = true;

  // Fill buckets from the last layer down: the order backward completes gradients in.
  const bool layer_per_bucket = zero_stage >= 2;
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    const size_t n = it->end - it->begin;
    const bool fits = !buckets_.empty() && !layer_per_bucket && buckets_.back().numel() + n <= bucket_cap;
    if (fits) {
      buckets_.back().first_layer = it->layer;
      buckets_.back().begin = it->begin;
      buckets_.back().layers++;
    } else {
      Bucket b;
      b.first_layer = b.last_layer = it->layer;
      b.layers = 1;
      b.begin = it->begin;
      b.end = it->end;
      buckets_.push_back(b);
    }
  }
  std::reverse(buckets_.begin(), buckets_.end());
  for (auto& b : buckets_) {
    b.padded = round_up(b.numel(), shards_);
    b.arena_offset = arena_numel_;
    b.shard_offset = shard_numel_;
    arena_numel_ += b.padded;
    shard_numel_ += b.padded / shards_;
  }
  my_pieces_ = pieces(rank_);
}

const Bucket& ShardLayout::bucket_of_layer(int layer) const {
  for (const auto& b : buckets_)
    if (layer >= b.first_layer && layer <= b.last_layer) return b;
  throw RuntimeError("ShardLayout: no bucket holds layer " + std::to_string(layer));
}

bool ShardLayout::holds_layer(int layer) const {
  return layer >= first_layer_ && layer <= last_layer_ && held_[static_cast<size_t>(layer - first_layer_)];
}

size_t ShardLayout::largest_piece_numel() const {
  size_t largest = 0;
  for (const Bucket& b : buckets_) largest = std::max(largest, piece_numel(b));
  return largest;
}

size_t ShardLayout::arena_offset(const ParamSpec& p) const {
  const Bucket& b = bucket_of_layer(p.layer);
  return b.arena_offset + (p.offset - b.begin);
}

std::vector<ShardPiece> ShardLayout::pieces(int shard_rank) const {
  check(shard_rank >= 0 && shard_rank < shards_,
        "ShardLayout: shard rank " + std::to_string(shard_rank) + " of " + std::to_string(shards_) + " shards");
  const auto& specs = table_->specs();
  std::vector<ShardPiece> out;
  for (const auto& b : buckets_) {
    const size_t q = piece_numel(b);
    const size_t lo = b.begin + shard_rank * q;                 // table-order range of the piece
    const size_t hi = std::min(b.begin + (shard_rank + 1) * q, b.end);
    for (size_t i = 0; i < specs.size() && lo < hi; i++) {
      const size_t p_lo = specs[i].offset, p_hi = specs[i].offset + specs[i].numel;
      const size_t a = std::max(lo, p_lo), z = std::min(hi, p_hi);
      if (a >= z) continue;
      ShardPiece piece;
      piece.param = i;
      piece.begin = a - p_lo;
      piece.end = z - p_lo;
      piece.shard_offset = b.shard_offset + (a - lo);
      piece.arena_offset = b.arena_offset + (a - b.begin);
      out.push_back(piece);
    }
  }
  return out;
}

}  // namespace pt
