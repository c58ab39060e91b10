#include "core/ops/moe_routing.h"

#include <string>

#include "core/common/error.h"

namespace pt {

MoeRouting plan_moe_routing(const int32_t* topk_expert, int N, int k, int E) {
  MoeRouting r;
  r.counts.assign(size_t(E), 0);
  const size_t NK = size_t(N) * k;
  for (size_t i = 0; i < NK; i++) {
    const int e = topk_expert[i];
    check(e >= 0 && e < E, "MoE routing: expert " + std::to_string(e) + " of " + std::to_string(E));
    r.counts[size_t(e)]++;
  }
  r.offsets.assign(size_t(E) + 1, 0);
  for (int e = 0; e < E; e++) r.offsets[size_t(e) + 1] = r.offsets[size_t(e)] + r.counts[size_t(e)];
  // Stable: within an expert, (token, choice) order.
  std::vector<int> next(r.offsets.begin(), r.offsets.end() - 1);
  r.slot_of.resize(NK);
  for (size_t i = 0; i < NK; i++) r.slot_of[i] = next[size_t(topk_expert[i])]++;
  return r;
}

}  // namespace pt
