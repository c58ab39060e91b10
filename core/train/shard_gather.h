// Full tensors from ZeRO shards: every rank of the shard group contributes its shard of one
// piece of optimizer state (master weights, an Adam moment) and every rank gets the whole of
// it back in the ParamTable's flat order. For tests that compare layouts, and for writers that
// want one full copy; checkpoints normally write each rank's own pieces instead.
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

}  // namespace pt
