// CommWait: what a rank blocked in a communication call is waiting for, as the hang watchdog
// prints it: the one peer of a send or receive, every other member of a collective's group, each
// with its host when the hosts are known.
#include <catch2/catch.hpp>

#include "core/dist/comm_wait.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

TEST_CASE("a rank in no call waits for nobody", "[watchdog]") {
  pt::set_rank_hosts({});
  CHECK(pt::describe_comm_wait().empty());
  const std::vector<int> group = {0, 1};
  { const pt::CommWait wait("all_reduce", group, 0); }
  CHECK(pt::describe_comm_wait().empty());  // the call returned
}

TEST_CASE("a receive names its peer, a collective the rest of its group, with their hosts", "[watchdog]") {
  pt::set_rank_hosts({"a", "a", "b", "b"});
  const std::vector<int> pipeline = {1, 3};  // world ranks, in group order
  {
    const pt::CommWait wait("recv from", pipeline, 0, 1);
    CHECK_THAT(pt::describe_comm_wait(), StartsWith("this rank has waited ") &&
                                             Contains(" s in recv from rank 3 (host b)"));
  }
  const std::vector<int> dp = {0, 1, 2, 3};
  {
    const pt::CommWait wait("all_reduce", dp, 1);
    CHECK_THAT(pt::describe_comm_wait(), Contains(" s in all_reduce with ranks 0 (host a), 2 (host b), 3 (host b)"));
  }
  pt::set_rank_hosts({});  // unknown hosts: ranks only
  const pt::CommWait wait("all_gather", pipeline, 1);
  CHECK_THAT(pt::describe_comm_wait(), Contains(" s in all_gather with rank 1"));
  CHECK_THAT(pt::describe_comm_wait(), !Contains("host"));
}
