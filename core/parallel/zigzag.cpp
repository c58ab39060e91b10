#include "core/parallel/zigzag.h"

#include <string>

namespace pt {

CpSplit::CpSplit(CpSplitKind kind, int T, int cp)
    : kind_(cp == 1 ? CpSplitKind::contiguous : kind), T_(T), cp_(cp) {
  check(cp >= 1, "context parallel: cp=" + std::to_string(cp) + " must be at least 1");
  kind = kind_;
  const int pieces = (kind == CpSplitKind::zigzag ? 2 : 1) * cp;
  check(T > 0 && T % pieces == 0,
        "context parallel: the sequence length " + std::to_string(T) + " must be a positive multiple of " +
            (kind == CpSplitKind::zigzag ? "2*cp = " : "cp = ") + std::to_string(pieces) +
            (kind == CpSplitKind::zigzag ? " (ring attention cuts it into 2*cp zigzag chunks)" : ""));
}

std::vector<int> CpSplit::chunks(int rank) const {
  check(rank >= 0 && rank < cp_,
        "CpSplit: rank " + std::to_string(rank) + " is not in a group of " + std::to_string(cp_));
  if (kind_ == CpSplitKind::zigzag) return {rank, 2 * cp_ - 1 - rank};
  return {rank};
}

std::vector<int32_t> CpSplit::positions(int rank) const {
  std::vector<int32_t> pos;
  pos.reserve(local_len());
  for (int c : chunks(rank))
    for (int i = 0; i < chunk_len(); i++) pos.push_back(c * chunk_len() + i);
  return pos;
}

}  // namespace pt
