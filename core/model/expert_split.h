// Expert parallel storage: which of a stage's parameters an expert-parallel rank holds.
//
// Under parallel.ep = P the routed experts of every sparse block are split over the P ranks of
// an ep group (core/dist/grid.h): rank r runs experts [r E/P, (r + 1) E/P) (MoeLayer) and holds
// only their weights, gradients, master weights and Adam moments. Everything else (attention,
// norms, the router, shared experts, embeddings) is dense: every rank of the group holds it, as
// plain data parallel has it. The two parts live in two ParamStores, each sharded and reduced over
// its own group (Megatron's "expert data parallel" group):
//   dense    reduced over dp x cp, ZeRO-sharded over the dp_shard x cp ranks (as without ep);
//   experts  reduced over the dp x cp ranks that hold the same experts (dp coordinate equal
//            modulo P: D cp / P ranks), ZeRO-sharded over those of one HSDP replica.
// Both tables keep the stage table's order, names and TpSlices, so init_params gives each
// tensor the values the whole model has, and checkpoints (global names) reshard freely across
// ep sizes.
#pragma once
#include <vector>

#include "core/model/param_table.h"

namespace pt {

// A routed expert's weight (ParamRole::expert_up or expert_down).
bool is_routed_expert(const ParamSpec& p);

struct ExpertSplit {
  ParamTable dense;    // every parameter but the routed experts, in stage order
  ParamTable experts;  // ep rank `ep_rank`'s routed experts, in stage order
};

// Splits `stage` (a stage table, possibly tensor-parallel) for ep rank `ep_rank` of `ep`.
// Each sparse block's role tensors must come per expert (Mixtral's experts.E.w1/w3/w2:
// a multiple of n_experts of them, expert e's consecutive); throws otherwise.
ExpertSplit split_expert_parallel(const ParamTable& stage, int n_experts, int ep, int ep_rank);

// The inverse for whole values: `dense` in split.dense order and `experts[r]` in ep rank r's
// expert table order (each of the ep ranks') -> every parameter in `stage` order.
std::vector<float> join_expert_parallel(const ParamTable& stage, int n_experts, const std::vector<float>& dense,
                                        const std::vector<std::vector<float>>& experts);

}  // namespace pt
