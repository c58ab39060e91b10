// ShardLayout: how one rank's parameters, gradients and optimizer state are laid out under a
// ZeRO stage, derived from the ParamTable alone (so every rank, the memory planner and the
// checkpoint code agree on it without talking).
//
// Buckets. The flat parameter order is cut into buckets of whole layers (a "layer" is a
// ParamSpec::layer value: the embeddings, each block, the final LayerNorm; each is contiguous
// in the table). Buckets are filled from the LAST layer down, because backward completes
// gradients in that order, so the first bucket it fills is the first one reduced. A bucket
// holds layers up to `bucket_cap` elements (a layer larger than the cap is a bucket of its own).
// Under ZeRO-2 and ZeRO-3 every layer is its own bucket: a layer is the unit whose gradient is
// reduced and freed (ZeRO-2/3) and whose parameters are gathered just before use (ZeRO-3).
//
// Shards. The S ranks of a shard group split every bucket equally: the bucket is padded with
// zeros to a multiple of S and rank k owns elements [k*q, (k+1)*q) of it, q = padded / S.
// (Megatron's distributed optimizer splits buckets the same way; it is what lets every
// reduce-scatter and all-gather move equal blocks.) A rank's shard is its piece of every bucket,
// in bucket order, so all ranks' shards have the same size. With one bucket it is exactly a
// flat contiguous range of the (padded) parameter arena. ZeRO-0 is the layout with S = 1.
//
// The arena. Buffers that hold every parameter (params under ZeRO 0-2, gradients under ZeRO
// 0-1) use the padded arena: each bucket starts at arena_offset and spans `padded` elements, so
// a bucket's reduce-scatter input and all-gather output are one contiguous range. With S = 1
// nothing is padded, the arena is the table's own flat order, and the shard is the whole arena
// at the same offsets: whatever the stage, one buffer can serve as both (ParamStore, GradSync
// and ParamGather allocate and copy nothing twice then).
#pragma once
#include <cstddef>
#include <vector>

#include "core/model/param_table.h"
#include "core/tensor/tensor.h"

namespace pt {

struct Bucket {
  int first_layer = 0, last_layer = 0;  // the layers it holds (ParamSpec::layer), ascending
  int layers = 0;                       // how many: every layer between them, except in a table of
                                        // some blocks only (expert parallel's experts: expert_split.h)
  size_t begin = 0, end = 0;            // its elements in the table's flat order
  size_t padded = 0;                    // end - begin rounded up to a multiple of the shard count
  size_t arena_offset = 0;              // where it starts in the padded arena
  size_t shard_offset = 0;              // where every rank's piece of it starts in that rank's shard
  size_t numel() const { return end - begin; }
};

// A range of one parameter that lies in a rank's shard.
struct ShardPiece {
  size_t param = 0;         // index into ParamTable::specs()
  size_t begin = 0;         // element range [begin, end) of the parameter (flattened)
  size_t end = 0;
  size_t shard_offset = 0;  // where element `begin` lives in the rank's shard
  size_t arena_offset = 0;  // where element `begin` lives in the padded arena
  size_t numel() const { return end - begin; }
};

class ShardLayout {
 public:
  // zero_stage 0..3; shard_count: ranks in the shard group (forced to 1 under ZeRO-0, which
  // shards nothing); shard_rank: this rank's index in it; bucket_cap: elements per bucket
  // (ZeRO 0 and 1 only).
  ShardLayout(const ParamTable& table, int zero_stage, int shard_count, int shard_rank, size_t bucket_cap);

  int zero_stage() const { return stage_; }
  int shard_count() const { return shards_; }
  int shard_rank() const { return rank_; }
  // One shard (ZeRO-0, or a shard group of one rank): shard and arena coincide (see above).
  bool single_shard() const { return shards_ == 1; }
  // What a rank holds in full (the rest it holds only as its shard).
  bool params_resident() const { return stage_ < 3; }
  bool grads_resident() const { return stage_ < 2; }
  // Where one shard lets a resident arena serve as a shard buffer (ParamStore allocates, the
  // memory plan counts, by these): f32 params as the master weights, the gradient arena as the
  // reduced gradient.
  bool master_is_params(DType compute) const { return single_shard() && params_resident() && compute == DType::f32; }
  bool grad_shard_is_arena() const { return single_shard() && grads_resident(); }

  const std::vector<Bucket>& buckets() const { return buckets_; }  // in arena (table) order
  const Bucket& bucket_of_layer(int layer) const;
  bool holds_layer(int layer) const;  // whether the table has parameters of `layer`
  int first_layer() const { return first_layer_; }  // ParamSpec::layer range of the table
  int last_layer() const { return last_layer_; }

  size_t arena_numel() const { return arena_numel_; }  // padded total
  size_t arena_offset(const ParamSpec& p) const;       // where p starts in the padded arena
  size_t shard_numel() const { return shard_numel_; }  // every rank's shard size
  size_t piece_numel(const Bucket& b) const { return b.padded / shards_; }
  size_t largest_piece_numel() const;  // of every bucket's

  // The parameter ranges in rank `shard_rank`'s shard, in shard order (padding is in none).
  std::vector<ShardPiece> pieces(int shard_rank) const;
  const std::vector<ShardPiece>& my_pieces() const { return my_pieces_; }

 private:
  const ParamTable* table_;
  int stage_, shards_, rank_;
  int first_layer_ = 0, last_layer_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<size_t> arena_offsets_;  // per spec
  size_t arena_numel_ = 0, shard_numel_ = 0;
  std::vector<ShardPiece> my_pieces_;
  std::vector<bool> held_;  // by layer - first_layer_: whether the table has that layer
};

// grad_bucket_mb (MiB of fp32 gradients) as elements, at least 1.
size_t bucket_cap_elements(double grad_bucket_mb);

}  // namespace pt
