// Full tensors from ZeRO shards: every rank of the shard group contributes its shard of one
// piece of optimizer state (master weights, an Adam moment) and every rank gets the whole of
// it back in the ParamTable's flat order. For tests that compare layouts, and for writers that
// want one full copy; checkpoints normally write each rank's own pieces instead. Under tensor
// parallel the result is still this rank's local pieces; gather_tensor_parallel then joins the
// tp ranks' pieces into whole parameters.
#pragma once
#include <vector>

#include "core/dist/comm.h"
#include "core/model/param_store.h"
#include "core/ops/ops.h"

namespace pt {

// `shard` is one of store's shard tensors (master_shard(), adam_m_shard(), adam_v_shard()).
// Collective over shard_group (the group the store's layout shards over); returns total_numel
// floats in table order.
std::vector<float> gather_shards(const ParamStore& store, Tensor shard, Comm& shard_group, Ops& ops);

// Whole parameters from tensor-parallel pieces. `local` holds this rank's pieces in
// `local_table`'s flat order (e.g. gather_shards' result); collective over `tp` (rank r of the
// group holds the pieces of TpSlice rank r); returns the same parameters in the same order, each
// whole (global shapes, their numels summed), every rank. A replicated parameter is taken from
// tp rank 0. tp.size() == 1 returns `local` unchanged.
std::vector<float> gather_tensor_parallel(const ParamTable& local_table, const std::vector<float>& local, Comm& tp,
                                          Ops& ops);

// Expert parallel: every parameter of `stage` (a stage table, in its order) from this rank's
// dense part (`dense`, in the split's dense order, e.g. gather_shards' result on the dense store)
// and its routed experts (`experts`, in its expert table's order); collective over `ep` (ep
// rank r holds the experts of expert_split.h's rank r), which contributes the other experts.
std::vector<float> gather_expert_parallel(const ParamTable& stage, int n_experts, const std::vector<float>& dense,
                                          const std::vector<float>& experts, Comm& ep, Ops& ops);

}  // namespace pt
