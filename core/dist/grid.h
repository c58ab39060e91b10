// Grid: rank <-> coordinates on the 4-D (tp, cp, dp, pp) grid, and the groups of ranks that
// share all coordinates but one. A rank is a mixed-radix number over parallel.order,
// innermost first: with the default "tp-cp-dp-pp", consecutive ranks differ in tp (TP stays
// inside a node) and pp varies slowest (PP crosses nodes).
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
  // The ranks that share tp and pp with `rank` (the dp x cp gradient-reduction group).
  std::vector<int> dp_cp_group(int rank) const;
  // One line per rank: "rank 3: tp 1 cp 0 dp 1 pp 0", for the start-up log.
  std::string describe() const;

 private:
  std::array<int, 4> size_{};       // indexed by Axis
  std::array<Axis, 4> order_{};     // innermost first
};

}  // namespace pt
