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

TEST_CASE("HSDP splits dp into replicas of shard groups, the shard index innermost", "[grid]") {
  ParallelSection p;
  p.dp = 4, p.cp = 2, p.dp_replicate = 2;
  const Grid g(p);  // ranks: cp innermost, then dp
  CHECK(g.dp_shard() == 2);
  // Rank 5 is cp 1, dp 2: replica 1, shard 0.
  CHECK(g.dp_shard_group(5) == std::vector<int>{4, 5, 6, 7});
  CHECK(g.dp_replicate_group(5) == std::vector<int>{1, 5});
  CHECK(g.dp_cp_group(5) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  const std::string d = g.describe();
  CHECK_THAT(d, Catch::Contains("2 replicas x 2 shards"));
  CHECK_THAT(d, Catch::Contains("ZeRO shard groups: [0 1 2 3] [4 5 6 7]"));
  CHECK_THAT(d, Catch::Contains("replica groups: [0 4] [1 5] [2 6] [3 7]"));
  CHECK_THAT(d, Catch::Contains("5 (0 1 2 0)"));

  SECTION("without HSDP the shard group is dp x cp and replicas are single ranks") {
    p.dp_replicate = 1;
    const Grid plain(p);
    CHECK(plain.dp_shard_group(5) == plain.dp_cp_group(5));
    CHECK(plain.dp_replicate_group(5) == std::vector<int>{5});
  }
  SECTION("dp_replicate must divide dp") {
    p.dp_replicate = 3;
    CHECK_THROWS_WITH(Grid(p), Catch::Contains("parallel.dp_replicate=3 must divide parallel.dp=4"));
  }
}
