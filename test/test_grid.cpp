// Grid: rank <-> (tp, cp, dp, pp) as a mixed-radix number over parallel.order.
#include <catch2/catch.hpp>

#include <set>

#include "core/common/error.h"
#include "core/dist/grid.h"

using namespace pt;

TEST_CASE("default order puts tp innermost and pp outermost", "[grid]") {
  ParallelSection p;
  p.tp = 2, p.cp = 2, p.dp = 2, p.pp = 2;
  const Grid g(p);
  REQUIRE(g.world_size() == 16);
  CHECK(g.coord(1).tp == 1);
  CHECK(g.coord(2).cp == 1);
  CHECK(g.coord(4).dp == 1);
  CHECK(g.coord(8).pp == 1);
  CHECK(g.group(5, Axis::tp) == std::vector<int>{4, 5});
  CHECK(g.group(5, Axis::pp) == std::vector<int>{5, 13});
  CHECK(g.dp_cp_group(1) == std::vector<int>{1, 3, 5, 7});
  std::set<int> seen;
  for (int r = 0; r < g.world_size(); r++) {
    CHECK(g.rank(g.coord(r)) == r);
    seen.insert(r);
  }
  CHECK(seen.size() == 16);
}

TEST_CASE("a custom order changes which axis is innermost", "[grid]") {
  ParallelSection p;
  p.tp = 2, p.dp = 3, p.order = "dp-tp-cp-pp";
  const Grid g(p);
  CHECK(g.coord(1).dp == 1);
  CHECK(g.coord(3).tp == 1);
  CHECK(g.group(0, Axis::dp) == std::vector<int>{0, 1, 2});
}

TEST_CASE("a bad order is a config error naming the key", "[grid]") {
  ParallelSection p;
  p.order = "tp-cp-dp";
  CHECK_THROWS_WITH(Grid(p), Catch::Contains("parallel.order"));
  p.order = "tp-cp-dp-xx";
  CHECK_THROWS_AS(Grid(p), ConfigError);
}
