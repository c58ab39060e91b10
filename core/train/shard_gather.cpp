#include "core/train/shard_gather.h"

#include <algorithm>

namespace pt {

std::vector<float> gather_shards(const ParamStore& store, Tensor shard, Comm& shard_group, Ops& ops) {
  const ShardLayout& layout = store.layout();
  const int shards = layout.shard_count();
  check(shards == 1 || shards == shard_group.size(),
        "gather_shards: the layout has " + std::to_string(shards) + " shards but the group " +
            std::to_string(shard_group.size()) + " ranks");
  const size_t n = layout.shard_numel();
  std::vector<float> all(n * shards);
  if (shards == 1) {
    ops.download(all.data(), DType::f32, shard, n);
  } else {
    Tensor gathered = ops.alloc(n * shards, DType::f32);
    shard_group.all_gather(shard, gathered);
    ops.download(all.data(), DType::f32, gathered, gathered.numel);
    ops.release(gathered);
  }
  const auto& specs = store.table().specs();
  std::vector<float> out(store.table().total_numel());
  for (int k = 0; k < shards; k++)
    for (const ShardPiece& piece : layout.pieces(k))
      std::copy_n(all.data() + k * n + piece.shard_offset, piece.numel(),
                  out.data() + specs[piece.param].offset + piece.begin);
  return out;
}

}  // namespace pt
