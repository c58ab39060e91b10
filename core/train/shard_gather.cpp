#include "core/train/shard_gather.h"

#include <algorithm>

#include "core/model/expert_split.h"

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

std::vector<float> gather_tensor_parallel(const ParamTable& local_table, const std::vector<float>& local, Comm& tp,
                                          Ops& ops) {
  const size_t n = local_table.total_numel();
  check(local.size() == n, "gather_tensor_parallel: " + std::to_string(local.size()) + " values for a table of " +
                               std::to_string(n));
  if (tp.size() == 1) return local;
  // Every tp rank's pieces have the same shapes, so the ranks' arenas are equal blocks.
  std::vector<float> all(n * tp.size());
  {
    Tensor send = ops.alloc(n, DType::f32), recv = ops.alloc(all.size(), DType::f32);
    ops.upload(send, local.data(), DType::f32, n);
    tp.all_gather(send, recv);
    ops.download(all.data(), DType::f32, recv, all.size());
    ops.release(send);
    ops.release(recv);
  }
  const auto global_numel = [](const ParamSpec& p) {
    size_t numel = 1;
    for (int64_t d : p.global_shape) numel *= static_cast<size_t>(d);
    return numel;
  };
  size_t total = 0;
  for (const ParamSpec& p : local_table.specs()) total += global_numel(p);
  std::vector<float> out(total);
  size_t at = 0;  // where the current parameter starts in `out`
  for (const ParamSpec& p : local_table.specs()) {
    check(p.tp.whole() || p.tp.parts == tp.size(),
          "gather_tensor_parallel: " + p.name + " is split " + std::to_string(p.tp.parts) +
              " ways but the tp group has " + std::to_string(tp.size()) + " ranks");
    // Replicated: rank 0's copy, the whole parameter (whole() maps local to global unchanged).
    const int holders = p.tp.whole() ? 1 : tp.size();
    for (int r = 0; r < holders; r++) {
      TpSlice slice = p.tp;
      slice.rank = r;
      const float* piece = all.data() + r * n + p.offset;
      slice.for_each_run(0, p.numel, [&](size_t local_i, size_t global_i, size_t count) {
        std::copy_n(piece + local_i, count, out.data() + at + global_i);
      });
    }
    at += global_numel(p);
  }
  return out;
}

std::vector<float> gather_expert_parallel(const ParamTable& stage, int n_experts, const std::vector<float>& dense,
                                          const std::vector<float>& experts, Comm& ep, Ops& ops) {
  // Every ep rank holds as many experts of the same shapes: equal blocks.
  const size_t n = experts.size();
  const int P = ep.size();
  Tensor mine = ops.alloc(n, DType::f32), all = ops.alloc(n * P, DType::f32);
  ops.upload(mine, experts.data(), DType::f32, n);
  ep.all_gather(mine, all);
  std::vector<float> host(n * P);
  ops.download(host.data(), DType::f32, all, host.size());
  ops.release(mine);
  ops.release(all);
  std::vector<std::vector<float>> blocks;
  for (int r = 0; r < P; r++) blocks.emplace_back(host.begin() + r * n, host.begin() + (r + 1) * n);
  return join_expert_parallel(stage, n_experts, dense, blocks);
}

}  // namespace pt
