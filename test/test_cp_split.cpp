// The context-parallel sequence split (core/parallel/zigzag.h): zigzag chunk assignment and
// positions on known values, every position owned exactly once, take/put round trips, the
// causal work balance that motivates zigzag, the contiguous split Ulysses uses, and the
// divisibility errors.
#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

#include "core/common/error.h"
#include "core/parallel/zigzag.h"

using namespace pt;

TEST_CASE("zigzag split: chunks and positions on known values", "[cp]") {
  const CpSplit z(CpSplitKind::zigzag, 8, 2);  // 4 chunks of 2
  CHECK(z.local_len() == 4);
  CHECK(z.chunk_len() == 2);
  CHECK(z.chunks(0) == std::vector<int>{0, 3});
  CHECK(z.chunks(1) == std::vector<int>{1, 2});
  CHECK(z.positions(0) == std::vector<int32_t>{0, 1, 6, 7});
  CHECK(z.positions(1) == std::vector<int32_t>{2, 3, 4, 5});
  const CpSplit z4(CpSplitKind::zigzag, 8, 4);  // 8 chunks of 1
  CHECK(z4.positions(0) == std::vector<int32_t>{0, 7});
  CHECK(z4.positions(3) == std::vector<int32_t>{3, 4});
  const CpSplit c(CpSplitKind::contiguous, 9, 3);
  CHECK(c.positions(1) == std::vector<int32_t>{3, 4, 5});
  CHECK(c.chunks(2) == std::vector<int>{2});
}

TEST_CASE("zigzag split: every position once, balanced causal work, take/put round trip", "[cp]") {
  for (CpSplitKind kind : {CpSplitKind::zigzag, CpSplitKind::contiguous})
    for (int cp : {1, 2, 3, 4}) {
      const int T = 2 * cp * 5;
      const CpSplit s(kind, T, cp);
      INFO("cp " << cp << (kind == CpSplitKind::zigzag ? " zigzag" : " contiguous"));
      std::vector<int> owner(T, -1);
      std::vector<long long> work(cp, 0);
      for (int r = 0; r < cp; r++)
        for (int32_t p : s.positions(r)) {
          REQUIRE(p >= 0);
          REQUIRE(p < T);
          CHECK(owner[p] == -1);
          owner[p] = r;
          work[r] += p + 1;  // a causal query at position p attends to p + 1 keys
        }
      for (int p = 0; p < T; p++) CHECK(owner[p] >= 0);
      if (kind == CpSplitKind::zigzag)
        for (int r = 1; r < cp; r++) CHECK(work[r] == work[0]);  // exactly balanced

      // take/put: B = 2 rows of width-3 token vectors.
      const int B = 2, W = 3;
      std::vector<int> global(size_t(B) * T * W);
      std::iota(global.begin(), global.end(), 0);
      std::vector<int> rebuilt(global.size(), -1);
      for (int r = 0; r < cp; r++) {
        const std::vector<int> local = s.take(global, B, r, W);
        const std::vector<int32_t> pos = s.positions(r);
        CHECK(local[(size_t(1) * s.local_len() + 1) * W + 2] == global[(size_t(1) * T + pos[1]) * W + 2]);
        s.put(rebuilt, local, B, r, W);
      }
      CHECK(rebuilt == global);
    }
}

TEST_CASE("zigzag split: a sequence that does not divide is an error naming the rule", "[cp]") {
  CHECK_THROWS_WITH(CpSplit(CpSplitKind::zigzag, 10, 2), Catch::Contains("multiple of 2*cp = 4"));
  CHECK_THROWS_AS(CpSplit(CpSplitKind::contiguous, 10, 3), RuntimeError);
  CHECK_NOTHROW(CpSplit(CpSplitKind::contiguous, 10, 5));
  CHECK_THROWS_AS(CpSplit(CpSplitKind::zigzag, 8, 0), RuntimeError);
  CHECK_THROWS_AS(CpSplit(CpSplitKind::zigzag, 8, 2).positions(2), RuntimeError);
}
