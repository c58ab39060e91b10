#include "core/train/grad_sync.h"

#include <algorithm>

namespace pt {

GradSync::GradSync(ParamStore& store, Ops& ops, Comm& dp_cp, Comm& shard, Comm& replicate)
    : store_(store), ops_(ops), dp_cp_(dp_cp), shard_(shard), replicate_(replicate), layout_(store.layout()) {
  check(layout_.shard_count() == (layout_.zero_stage() == 0 ? 1 : shard.size()),
        "GradSync: the layout has " + std::to_string(layout_.shard_count()) + " shards but the shard group " +
            std::to_string(shard.size()) + " ranks");
  layers_left_.resize(layout_.buckets().size());
  launched_.resize(layout_.buckets().size());
  working_.resize(static_cast<size_t>(layout_.last_layer() - layout_.first_layer() + 1));
  // With one shard a layer's gradient is accumulated in the shard itself (acquire_grads):
  // there is no reduce-scatter whose result would need a place of its own.
  if (!layout_.grads_resident() && !layout_.single_shard()) {
    size_t largest = 0;
    for (const auto& b : layout_.buckets()) largest = std::max(largest, layout_.piece_numel(b));
    piece_sum_ = ops_.alloc(largest, DType::f32);
  }
}

GradSync::~GradSync() {
  for (int l = layout_.first_layer(); l <= layout_.last_layer(); l++) drop_working(l);
  if (piece_sum_) ops_.release(piece_sum_);
}

Tensor& GradSync::working(int layer) { return working_[static_cast<size_t>(layer - layout_.first_layer())]; }

void GradSync::drop_working(int layer) {
  Tensor& w = working(layer);
  if (!w) return;
  store_.detach_grads(layer);
  if (layout_.single_shard()) w = Tensor{};  // a view of the shard, not ours to free
  else ops_.release(w);
}

size_t GradSync::bucket_index(int layer) const {
  const Bucket& b = layout_.bucket_of_layer(layer);
  return static_cast<size_t>(&b - layout_.buckets().data());
}

void GradSync::start_step() {
  // Backward accumulates into the full arena (ZeRO 0-1; ZeRO-1's reduce-scatter then overwrites
  // all of the shard), ZeRO 2-3 into the shard.
  ops_.zero(layout_.grads_resident() ? store_.all_grads() : store_.grad_shard());
  std::fill(launched_.begin(), launched_.end(), false);
}

void GradSync::start_micro_step(bool last) {
  last_micro_ = last;
  for (size_t b = 0; b < layers_left_.size(); b++) {
    const Bucket& bucket = layout_.buckets()[b];
    layers_left_[b] = bucket.layers;
  }
}

void GradSync::acquire_grads(int layer) {
  if (layout_.grads_resident()) return;
  Tensor& w = working(layer);
  if (w) return;  // already acquired in this micro-step
  const Bucket& b = layout_.bucket_of_layer(layer);
  // One shard: the layer's range of the shard is its whole gradient, so backward accumulates
  // into it directly, micro-step after micro-step, as it does into ZeRO-0's arena. Otherwise a
  // zeroed buffer (padding included) for this micro-step, reduce-scattered into the shard.
  w = layout_.single_shard() ? store_.grad_shard().slice(b.shard_offset, b.padded) : ops_.alloc(b.padded, DType::f32);
  store_.attach_grads(layer, w);
}

void GradSync::grads_ready(int layer) {
  if (!layout_.grads_resident()) return reduce_layer(layer);
  const size_t b = bucket_index(layer);
  // Earlier micro-steps only accumulate: reducing once per step moves the least data.
  if (--layers_left_[b] == 0 && last_micro_ && !launched_[b]) reduce_bucket(b);
}

void GradSync::reduce_bucket(size_t b) {
  const Bucket& bucket = layout_.buckets()[b];
  const Tensor full = store_.all_grads().slice(bucket.arena_offset, bucket.padded);
  // The bucket is final (no later micro-step writes it): its reduction is started, and
  // finish_step waits for it, so backward overlaps it where the backend can (NCCL).
  if (layout_.single_shard()) {
    // ZeRO-0, or ZeRO-1 over one shard: the arena is the shard (ParamStore), reduced in place
    // over dp x cp, which with one shard is the replicas' group. A reduce-scatter over one
    // rank would only copy the bucket onto itself.
    dp_cp_.start_all_reduce(full);
  } else {
    const Tensor piece = store_.grad_shard().slice(bucket.shard_offset, layout_.piece_numel(bucket));
    if (replicate_.size() == 1) {
      shard_.start_reduce_scatter(full, piece);
    } else {
      // HSDP: the replicas' all-reduce reads the reduce-scatter's result on another communicator,
      // which would not wait for a started one: both complete in order instead.
      shard_.reduce_scatter(full, piece);
      replicate_.all_reduce(piece);
    }
  }
  launched_[b] = true;
}

void GradSync::reduce_layer(int layer) {
  const Tensor w = working(layer);
  check(static_cast<bool>(w), "GradSync: layer " + std::to_string(layer) + " reported ready without acquire_grads");
  if (!layout_.single_shard()) {  // one shard: backward accumulated into the shard itself
    const Bucket& bucket = layout_.bucket_of_layer(layer);
    const size_t q = layout_.piece_numel(bucket);
    const Tensor sum = piece_sum_.slice(0, q);
    shard_.reduce_scatter(w, sum);
    const Tensor acc = store_.grad_shard().slice(bucket.shard_offset, q);
    ops_.add(acc, acc, sum, q);
  }
  drop_working(layer);
}

void GradSync::finish_step() {
  if (layout_.grads_resident()) {
    // A bucket whose layers were not all reported (a stage without hooks) is reduced now, still
    // in backward's order.
    for (size_t b = launched_.size(); b-- > 0;)
      if (!launched_[b]) reduce_bucket(b);
    (layout_.single_shard() ? dp_cp_ : shard_).wait_started();
    return;
  }
  for (size_t l = 0; l < working_.size(); l++)
    check(!working_[l], "GradSync: the gradient of layer " + std::to_string(int(l) + layout_.first_layer()) +
                            " was acquired but never reported ready");
  replicate_.all_reduce(store_.grad_shard());
}

}  // namespace pt
