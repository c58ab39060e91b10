// ParamStore: the model state one rank holds, on the backend's device, laid out by a
// ShardLayout (core/model/shard_layout.h).
//  - params: the compute dtype (what forward reads). Resident in full (the padded arena) under
//    ZeRO 0-2; under ZeRO-3 only this rank's shard, and a layer's full parameters exist only
//    while a working buffer is attached for it (ZeRO gathers them just before use).
//  - grads: fp32, as backward accumulates them. Resident in full under ZeRO 0-1; under ZeRO 2-3
//    a layer's gradient lives in a working buffer attached for its backward and is
//    reduce-scattered into the shard as soon as it is final.
//  - the shard (fp32, layout().shard_numel() elements): master weights, Adam moments and the
//    reduced gradient the optimizer reads.
// With one shard (ZeRO-0, or any stage over a shard group of one rank) the shard is the whole
// model in the ParamTable's own flat order, and no resident arena is duplicated for it: the
// reduced gradient IS the gradient arena (ZeRO 0-1), and with an f32 compute dtype the master
// weights ARE the params (ZeRO 0-2) or the parameter shard (ZeRO-3).
#pragma once
#include <vector>

#include "core/model/param_table.h"
#include "core/model/shard_layout.h"
#include "core/ops/ops.h"

namespace pt {

class ParamStore {
 public:
  // Every parameter resident (one rank, ZeRO-0).
  ParamStore(const ParamTable& table, Ops& ops);
  // What this rank holds under `layout` (copied; built from the same table).
  ParamStore(const ParamTable& table, const ShardLayout& layout, Ops& ops);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Sets the weights from host fp32 values (total_numel of them, table order): the resident
  // params and this rank's shard of the master weights each take what they hold.
  void load_master(const float* host);
  // Downloads the fp32 master weights to host (total_numel floats, table order). Only when this
  // rank's shard is the whole model; sharded ranks gather them (core/train/shard_gather.h).
  void save_master(float* host) const;

  // Where a parameter's values and its gradient are now: the resident arena, or the working
  // buffer attached for its layer. Throws naming the parameter when it is not available.
  Tensor param(const ParamSpec& p) const;
  Tensor grad(const ParamSpec& p) const;
  Tensor param(const std::string& name) const { return param(table_.get(name)); }
  Tensor grad(const std::string& name) const { return grad(table_.get(name)); }
  // The parameters (or gradients) of `role` in block `layer` as one tensor over its adjacent
  // pieces (role_run: llama's q, k, v projections are one matmul); null where the table has none.
  Tensor role_param(ParamRole role, int layer) const { return this->role(role, layer).param(); }
  Tensor role_grad(ParamRole role, int layer) const { return this->role(role, layer).grad(); }

  // A role of one layer (or one parameter), found once: reading it then looks nothing up,
  // wherever the layer's tensors are at that moment (the resident arena, or the working buffer
  // ZeRO attached for this use), so a stage resolves its roles when it is built and reads them
  // every micro-batch. Valid while the store lives; a default one (a role the table does not
  // have) reads as null tensors.
  class Role {
   public:
    Role() = default;
    Tensor param() const;
    Tensor grad() const;

   private:
    friend class ParamStore;
    const ParamStore* store_ = nullptr;
    const ParamSpec* first_ = nullptr;  // named when its layer is not available
    size_t layer_slot_ = 0;             // its layer's index among the store's layers
    size_t arena_offset_ = 0;           // where it starts in the resident arena
    size_t bucket_offset_ = 0;          // where it starts in its layer's bucket (a working buffer)
    size_t numel_ = 0;
  };
  Role role(ParamRole role, int layer) const;
  // One parameter's optimizer state: only when this rank's shard is the whole model.
  Tensor master(const ParamSpec& p) const { return whole_slice(master_, p, "master weights"); }
  Tensor adam_m(const ParamSpec& p) const { return whole_slice(m_, p, "Adam moments"); }
  Tensor adam_v(const ParamSpec& p) const { return whole_slice(v_, p, "Adam moments"); }

  // The resident arenas (padded layout): params under ZeRO 0-2, grads under ZeRO 0-1.
  Tensor all_params() const;
  Tensor all_grads() const;
  const ParamTable& table() const { return table_; }
  const ShardLayout& layout() const { return layout_; }
  bool master_is_params() const { return master_.data == params_.data; }
  // True when this rank's shard is the whole model (one shard: ZeRO-0 or a shard group of one).
  bool holds_whole_shard() const { return layout_.single_shard(); }

  // ---- the shard (layout().shard_numel() fp32 elements each; with one shard, see above) ----
  Tensor master_shard() const { return master_; }
  Tensor adam_m_shard() const { return m_; }
  Tensor adam_v_shard() const { return v_; }
  Tensor grad_shard() const { return grad_shard_; }
  // ZeRO-3: this rank's parameters in the compute dtype (the master shard when that is f32).
  Tensor param_shard() const { return param_shard_; }
  // Where the optimizer writes the updated parameters of one of this rank's pieces: its range
  // of the resident arena (ZeRO 0-2; ZeRO 1-2 then all-gather the bucket), or its parameter
  // shard (ZeRO-3).
  Tensor param_piece(const ShardPiece& piece) const;

  // ---- working buffers (ZeRO-3 parameters, ZeRO-2/3 gradients) ----
  // While attached, `buf` holds the whole (padded) bucket of `layer`; the caller owns it (with
  // one shard it is the layer's range of this store's own shard: ParamGather, GradSync).
  void attach_params(int layer, Tensor buf) { attached(params_at_, layer) = buf; }
  void detach_params(int layer) { attached(params_at_, layer) = Tensor{}; }
  void attach_grads(int layer, Tensor buf) { attached(grads_at_, layer) = buf; }
  void detach_grads(int layer) { attached(grads_at_, layer) = Tensor{}; }

 private:
  Tensor whole_slice(Tensor shard, const ParamSpec& p, const char* what) const;
  // `numel` elements from the start of `first`, a parameter of this store's table.
  Role run(const ParamSpec& first, size_t numel) const;
  Tensor locate(Tensor arena, const std::vector<Tensor>& at, const Role& r, const char* what) const;
  Tensor& attached(std::vector<Tensor>& at, int layer);
  Tensor alloc(size_t n, DType dtype);

  const ParamTable& table_;
  ShardLayout layout_;
  Ops& ops_;
  std::vector<Tensor> owned_;        // every buffer allocated here (aliases appear once)
  Tensor params_, grads_;            // resident arenas, or empty
  Tensor master_, m_, v_, grad_shard_, param_shard_;
  std::vector<Tensor> params_at_, grads_at_;  // attached working buffers, by layer
};

}  // namespace pt
