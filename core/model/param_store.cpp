#include "core/model/param_store.h"

namespace pt {

ParamStore::ParamStore(const ParamTable& table, Ops& ops)
    : ParamStore(table, ShardLayout(table, 0, 1, 0, table.total_numel()), ops) {}

ParamStore::ParamStore(const ParamTable& table, const ShardLayout& layout, Ops& ops)
    : table_(table), layout_(layout), ops_(ops) {
  const size_t arena = layout.arena_numel(), shard = layout.shard_numel();
  const DType compute = ops.compute_dtype();
  if (layout.params_resident()) params_ = alloc(arena, compute);
  if (layout.grads_resident()) grads_ = alloc(arena, DType::f32);
  // One shard (ZeRO-0, or any stage over a shard group of one rank): the shard is the whole
  // arena, unpadded and at the same offsets, so a resident arena holding the same values serves
  // as it. A second copy would only duplicate it: the f32 params are the master weights, and
  // the full gradient is the reduced one (ZeRO 0-1: GradSync reduces the arena in place).
  master_ = layout.master_is_params(compute) ? params_ : alloc(shard, DType::f32);
  grad_shard_ = layout.grad_shard_is_arena() ? grads_ : alloc(shard, DType::f32);
  m_ = alloc(shard, DType::f32);
  v_ = alloc(shard, DType::f32);
  if (!layout.params_resident()) param_shard_ = compute == DType::f32 ? master_ : alloc(shard, compute);
  const size_t layers = static_cast<size_t>(layout.last_layer() - layout.first_layer() + 1);
  params_at_.resize(layers);
  grads_at_.resize(layers);
}

ParamStore::~ParamStore() {
  for (auto& t : owned_) ops_.release(t);
}

Tensor ParamStore::alloc(size_t n, DType dtype) {
  owned_.push_back(ops_.alloc(n, dtype));
  return owned_.back();
}

Tensor& ParamStore::attached(std::vector<Tensor>& at, int layer) {
  check(layer >= layout_.first_layer() && layer <= layout_.last_layer(),
        "ParamStore: no layer " + std::to_string(layer));
  return at[static_cast<size_t>(layer - layout_.first_layer())];
}

ParamStore::Role ParamStore::run(const ParamSpec& first, size_t numel) const {
  const Bucket& b = layout_.bucket_of_layer(first.layer);
  Role r;
  r.store_ = this;
  r.first_ = &first;
  r.layer_slot_ = static_cast<size_t>(first.layer - layout_.first_layer());
  r.bucket_offset_ = first.offset - b.begin;
  r.arena_offset_ = b.arena_offset + r.bucket_offset_;
  r.numel_ = numel;
  return r;
}

Tensor ParamStore::locate(Tensor arena, const std::vector<Tensor>& at, const Role& r, const char* what) const {
  if (arena) return arena.slice(r.arena_offset_, r.numel_);
  const Tensor buf = at[r.layer_slot_];
  if (!buf)  // the message is built only when thrown: this runs for every tensor a stage reads
    throw RuntimeError(std::string("the ") + what + " of " + r.first_->name + " (layer " +
                       std::to_string(r.first_->layer) + ") are sharded (ZeRO-" +
                       std::to_string(layout_.zero_stage()) + ") and no working buffer is attached for its layer");
  return buf.slice(r.bucket_offset_, r.numel_);
}

Tensor ParamStore::param(const ParamSpec& p) const { return run(p, p.numel).param(); }
Tensor ParamStore::grad(const ParamSpec& p) const { return run(p, p.numel).grad(); }

ParamStore::Role ParamStore::role(ParamRole role, int layer) const {
  const RoleRun r = role_run(table_, role, layer);
  return r ? run(*r.first, r.numel) : Role();
}

Tensor ParamStore::Role::param() const {
  return store_ ? store_->locate(store_->params_, store_->params_at_, *this, "parameters") : Tensor{};
}

Tensor ParamStore::Role::grad() const {
  return store_ ? store_->locate(store_->grads_, store_->grads_at_, *this, "gradients") : Tensor{};
}

Tensor ParamStore::whole_slice(Tensor shard, const ParamSpec& p, const char* what) const {
  check(holds_whole_shard(), std::string("the ") + what + " of " + p.name + " are sharded over " +
                                 std::to_string(layout_.shard_count()) + " ranks (ZeRO-" +
                                 std::to_string(layout_.zero_stage()) + "); this rank holds only its shard");
  // One shard: nothing is padded, so shard, arena and table offsets coincide.
  return shard.slice(p.offset, p.numel);
}

Tensor ParamStore::all_params() const {
  check(static_cast<bool>(params_), "the parameters are sharded (ZeRO-3): there is no full parameter arena");
  return params_;
}

Tensor ParamStore::all_grads() const {
  check(static_cast<bool>(grads_), "the gradients are sharded (ZeRO-" + std::to_string(layout_.zero_stage()) +
                                       "): there is no full gradient arena");
  return grads_;
}

Tensor ParamStore::param_piece(const ShardPiece& piece) const {
  if (params_) return params_.slice(piece.arena_offset, piece.numel());
  return param_shard_.slice(piece.shard_offset, piece.numel());
}

void ParamStore::load_master(const float* host) {
  const auto& specs = table_.specs();
  if (params_)
    for (const auto& p : specs) ops_.upload(params_.slice(layout_.arena_offset(p), p.numel), host + p.offset, DType::f32, p.numel);
  if (!master_is_params())
    for (const auto& piece : layout_.my_pieces())
      ops_.upload(master_.slice(piece.shard_offset, piece.numel()), host + specs[piece.param].offset + piece.begin,
                  DType::f32, piece.numel());
  if (param_shard_ && param_shard_.data != master_.data) ops_.copy(param_shard_, master_, master_.numel);
}

void ParamStore::save_master(float* host) const {
  check(holds_whole_shard(), "save_master: the master weights are sharded over " +
                                 std::to_string(layout_.shard_count()) + " ranks; gather them first");
  const auto& specs = table_.specs();
  for (const auto& piece : layout_.my_pieces())
    ops_.download(host + specs[piece.param].offset + piece.begin, DType::f32,
                  master_.slice(piece.shard_offset, piece.numel()), piece.numel());
}

}  // namespace pt
