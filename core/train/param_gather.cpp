#include "core/train/param_gather.h"

namespace pt {

ParamGather::ParamGather(ParamStore& store, Ops& ops, Comm& shard)
    : store_(store), ops_(ops), shard_(shard), layout_(store.layout()) {
  working_.resize(static_cast<size_t>(layout_.last_layer() - layout_.first_layer() + 1));
}

ParamGather::~ParamGather() {
  for (int l = layout_.first_layer(); l <= layout_.last_layer(); l++) release(l);
}

void ParamGather::acquire(int layer) {
  if (layout_.params_resident()) return;
  Tensor& w = working_[static_cast<size_t>(layer - layout_.first_layer())];
  if (w) return;
  const Bucket& b = layout_.bucket_of_layer(layer);
  const Tensor piece = store_.param_shard().slice(b.shard_offset, layout_.piece_numel(b));
  if (layout_.single_shard()) {
    w = piece;  // one shard: the piece is the whole layer, used where it is
  } else {
    w = ops_.alloc(b.padded, ops_.compute_dtype());
    shard_.all_gather(piece, w);
  }
  store_.attach_params(layer, w);
}

void ParamGather::release(int layer) {
  Tensor& w = working_[static_cast<size_t>(layer - layout_.first_layer())];
  if (!w) return;
  store_.detach_params(layer);
  if (layout_.single_shard()) w = Tensor{};  // a view of the shard, not ours to free
  else ops_.release(w);
}

void ParamGather::gather_updated() {
  // One shard: the optimizer updated every parameter in place; nothing to gather.
  if (layout_.single_shard() || !layout_.params_resident()) return;
  const Tensor params = store_.all_params();
  for (const auto& b : layout_.buckets()) {
    const size_t q = layout_.piece_numel(b);
    const Tensor full = params.slice(b.arena_offset, b.padded);
    shard_.all_gather(full.slice(static_cast<size_t>(layout_.shard_rank()) * q, q), full);  // in place
  }
}

}  // namespace pt
