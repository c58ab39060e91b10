#include "core/model/expert_split.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "core/common/error.h"

namespace pt {

bool is_routed_expert(const ParamSpec& p) {
  return p.role == ParamRole::expert_up || p.role == ParamRole::expert_down;
}

namespace {

// The expert each routed tensor of `stage` belongs to (-1 for the rest), by spec index: a role's
// tensors of one layer come expert by expert, the same number for each.
std::vector<int> expert_of_specs(const ParamTable& stage, int n_experts) {
  const auto& specs = stage.specs();
  std::map<std::pair<int, ParamRole>, int> count;
  for (const ParamSpec& p : specs)
    if (is_routed_expert(p)) count[{p.layer, p.role}]++;
  std::map<std::pair<int, ParamRole>, int> seen;
  std::vector<int> out(specs.size(), -1);
  for (size_t i = 0; i < specs.size(); i++) {
    const ParamSpec& p = specs[i];
    if (!is_routed_expert(p)) continue;
    const int n = count[{p.layer, p.role}];
    check(n % n_experts == 0, "expert parallel needs one tensor (or a fixed number) per expert: " +
                                  std::to_string(n) + " tensors of role " + to_string(p.role) + " in layer " +
                                  std::to_string(p.layer) + " for " + std::to_string(n_experts) + " experts");
    out[i] = seen[{p.layer, p.role}]++ / (n / n_experts);
  }
  return out;
}

}  // namespace

ExpertSplit split_expert_parallel(const ParamTable& stage, int n_experts, int ep, int ep_rank) {
  check(n_experts > 0 && ep >= 1 && n_experts % ep == 0 && ep_rank >= 0 && ep_rank < ep,
        "split_expert_parallel: " + std::to_string(n_experts) + " experts over ep " + std::to_string(ep) +
            ", rank " + std::to_string(ep_rank));
  const std::vector<int> expert = expert_of_specs(stage, n_experts);
  const int per_rank = n_experts / ep;
  std::vector<ParamSpec> dense, mine;
  for (size_t i = 0; i < stage.specs().size(); i++) {
    if (expert[i] < 0)
      dense.push_back(stage.specs()[i]);
    else if (expert[i] / per_rank == ep_rank)
      mine.push_back(stage.specs()[i]);
  }
  return {ParamTable(std::move(dense)), ParamTable(std::move(mine))};
}

std::vector<float> join_expert_parallel(const ParamTable& stage, int n_experts, const std::vector<float>& dense,
                                        const std::vector<std::vector<float>>& experts) {
  const int ep = static_cast<int>(experts.size());
  std::vector<ExpertSplit> parts;
  for (int r = 0; r < ep; r++) parts.push_back(split_expert_parallel(stage, n_experts, ep, r));
  check(dense.size() == parts[0].dense.total_numel(), "join_expert_parallel: the dense values' size");
  std::vector<float> out(stage.total_numel());
  std::map<std::string, size_t> offset_of;
  for (const ParamSpec& p : stage.specs()) offset_of[p.name] = p.offset;
  // Copies every parameter of `table` (values `v`) to its place in the stage's order.
  auto place = [&](const ParamTable& table, const std::vector<float>& v) {
    check(v.size() == table.total_numel(), "join_expert_parallel: an expert part's size");
    for (const ParamSpec& p : table.specs())
      std::copy_n(v.begin() + p.offset, p.numel, out.begin() + offset_of.at(p.name));
  };
  place(parts[0].dense, dense);
  for (int r = 0; r < ep; r++) place(parts[r].experts, experts[r]);
  return out;
}

}  // namespace pt
