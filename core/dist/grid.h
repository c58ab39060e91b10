// Grid: rank <-> coordinates on the 4-D (tp, cp, dp, pp) grid, and the groups of ranks that
// share all coordinates but one. A rank is a mixed-radix number over parallel.order,
// innermost first: with the default "tp-cp-dp-pp", consecutive ranks differ in tp (TP stays
// inside a node) and pp varies slowest (PP crosses nodes).
//
// HSDP splits the dp axis further: dp = dp_replicate x dp_shard, with the shard index
// innermost (dp coordinate d is replica d / dp_shard, shard d % dp_shard), as torchtitan's mesh
// does, so a shard group's ranks are close together and replicas are far apart.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "core/config/run_config.h"

namespace pt {

enum class Axis { tp = 0, cp = 1, dp = 2, pp = 3 };

struct Coord {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  int& operator[](Axis a);
  int operator[](Axis a) const;
};

class Grid {
 public:
  explicit Grid(const ParallelSection& parallel);
  int world_size() const { return size_[0] * size_[1] * size_[2] * size_[3]; }
  int size(Axis a) const { return size_[static_cast<int>(a)]; }
  Coord coord(int rank) const;
  int rank(const Coord& c) const;
  // The ranks that share every coordinate of `rank` except `axis`, ordered by that axis.
  std::vector<int> group(int rank, Axis axis) const;
  // The ranks that share tp and pp with `rank` (the dp x cp gradient-reduction group),
  // ordered by (dp, cp).
  std::vector<int> dp_cp_group(int rank) const;
  int dp_replicate() const { return replicate_; }
  int dp_shard() const { return size(Axis::dp) / replicate_; }
  // The ranks that share tp, pp and the HSDP replica with `rank`: the dp_shard x cp ranks over
  // which ZeRO state is sharded, ordered by (dp, cp). Without HSDP it is dp_cp_group.
  std::vector<int> dp_shard_group(int rank) const;
  // The ranks that hold the same ZeRO shard as `rank` in the other replicas (same tp, pp, cp
  // and shard index), ordered by replica. One rank without HSDP.
  std::vector<int> dp_replicate_group(int rank) const;
  // Expert parallel (parallel.ep): the ep consecutive dp ranks around `rank` (dp coordinates
  // d - d % ep .. + ep - 1, sharing tp, cp and pp), which split the routed experts between them
  // and exchange tokens all-to-all. One rank when ep is 1.
  int ep() const { return ep_; }
  std::vector<int> ep_group(int rank) const;
  // The dp x cp ranks that hold the same routed experts as `rank` (dp coordinate equal modulo ep),
  // ordered by (dp, cp): the group whose expert gradients add up (core/model/expert_split.h).
  // dp_cp_group when ep is 1.
  std::vector<int> expert_dp_cp_group(int rank) const;
  // Those of them in `rank`'s HSDP replica: the ZeRO shard group of the experts (their replicas
  // are dp_replicate_group's, as ep divides dp_shard). dp_shard_group when ep is 1.
  std::vector<int> expert_shard_group(int rank) const;
  // The layout for the start-up log, compactly: the degrees, each rank's coordinates, and the
  // groups of every axis larger than one (long lists are elided).
  std::string describe() const;

 private:
  // The members of `group` that hold the same routed experts as `rank` (expert_dp_cp_group).
  std::vector<int> holding_experts_of(int rank, const std::vector<int>& group) const;

  std::array<int, 4> size_{};       // indexed by Axis
  std::array<Axis, 4> order_{};     // innermost first
  int replicate_ = 1;               // parallel.dp_replicate
  int ep_ = 1;                      // parallel.ep
};

}  // namespace pt
