// The mixture-of-experts routing plan on the host: where each (token, choice) lands when the rows
// are grouped by expert. CpuOps::moe_route computes it with this; the GPU's kernel
// (cuda/moe_routing.cu) is checked against it.
#pragma once
#include <cstdint>
#include <vector>

namespace pt {

// slot_of[n k + j]: the row of token n's j-th choice; the rows of expert e are
// [offsets[e], offsets[e + 1]), in (token, choice) order (a stable counting sort).
struct MoeRouting {
  std::vector<int32_t> slot_of;
  std::vector<int> counts;   // [E]
  std::vector<int> offsets;  // [E + 1]
};
// From topk_expert [N k]; an expert id outside [0, E) is an error.
MoeRouting plan_moe_routing(const int32_t* topk_expert, int N, int k, int E);

}  // namespace pt
