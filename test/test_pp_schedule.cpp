// Pipeline schedules: every rank's action list, run together by the simulator, never deadlocks,
// computes every micro-batch exactly once per virtual stage in dependency order, and has the
// bubble of the formula; and the simulator itself catches broken schedules.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <tuple>

#include "core/common/error.h"
#include "core/train/pp_bubble.h"
#include "core/train/pp_schedule.h"
#include "core/train/pp_simulator.h"

using namespace pt;

namespace {

constexpr PipeSchedule kKinds[] = {PipeSchedule::afab, PipeSchedule::one_f_one_b, PipeSchedule::interleaved};

struct Case {
  PipeSchedule kind;
  int pp, v, m;
};

bool valid(const Case& c) {
  try {
    check_pipeline_schedule(c.kind, c.pp, c.v, c.m);
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

// The grid (pp in {2,4}, m in 1..8, v in {1,2}) plus pp = 1 and the odd ring pp = 3,
// keeping the combinations each kind accepts.
std::vector<Case> valid_cases() {
  std::vector<Case> out;
  for (PipeSchedule kind : kKinds)
    for (int pp : {1, 2, 3, 4})
      for (int v : {1, 2})
        for (int m = 1; m <= 8; m++)
          if (valid({kind, pp, v, m})) out.push_back({kind, pp, v, m});
  return out;
}

std::string describe(const Case& c) {
  return std::string(to_string(c.kind)) + " pp=" + std::to_string(c.pp) + " v=" + std::to_string(c.v) +
         " m=" + std::to_string(c.m);
}

// Checks the dependencies from the timeline alone, independently of the simulator's own checks:
// forward of stage s after stage s-1's, backward of s after s+1's and after its own forward.
void check_dependencies(const PipeSimReport& rep, const Case& c) {
  std::map<std::pair<int, int>, PipeSlot> fwd, bwd;  // (stage, micro)
  for (int r = 0; r < c.pp; r++)
    for (const PipeSlot& slot : rep.timeline[r]) {
      const int s = slot.action.chunk * c.pp + r;
      auto& table = slot.action.op == PipeOp::forward ? fwd : bwd;
      REQUIRE(table.emplace(std::pair{s, slot.action.micro_batch}, slot).second);  // exactly once
    }
  const int stages = c.pp * c.v;
  REQUIRE(fwd.size() == size_t(stages * c.m));
  REQUIRE(bwd.size() == size_t(stages * c.m));
  for (int s = 0; s < stages; s++)
    for (int mb = 0; mb < c.m; mb++) {
      if (s > 0) CHECK(fwd[{s, mb}].start >= fwd[{s - 1, mb}].end);
      if (s + 1 < stages) CHECK(bwd[{s, mb}].start >= bwd[{s + 1, mb}].end);
      CHECK(bwd[{s, mb}].start >= fwd[{s, mb}].end);
    }
}

}  // namespace

TEST_CASE("every schedule runs to completion under rendezvous sends", "[pp_schedule]") {
  for (const Case& c : valid_cases()) {
    INFO(describe(c));
    const auto ranks = pipeline_schedule_all_ranks(c.kind, c.pp, c.v, c.m);
    for (PipeCosts costs : {PipeCosts{1, 1}, PipeCosts{1, 2}}) {
      const PipeSimReport rep = simulate_pipeline(ranks, c.v, c.m, costs, PipeComm::blocking);
      INFO("F=" << costs.forward << " B=" << costs.backward << ": " << rep.error);
      REQUIRE(rep.ok());
      check_dependencies(rep, c);
    }
  }
}

TEST_CASE("each rank forwards and backwards each of its (micro-batch, chunk) exactly once", "[pp_schedule]") {
  for (const Case& c : valid_cases()) {
    INFO(describe(c));
    size_t sends = 0, recvs = 0;
    for (int r = 0; r < c.pp; r++) {
      const auto actions = pipeline_schedule(c.kind, c.pp, c.v, c.m, r);
      std::map<std::tuple<PipeOp, int, int>, int> count;
      for (const PipeAction& a : actions) {
        if (a.op == PipeOp::forward || a.op == PipeOp::backward) {
          count[{a.op, a.micro_batch, a.chunk}]++;
          CHECK(a.peer == -1);
        }
        sends += a.op == PipeOp::send_activation || a.op == PipeOp::send_grad;
        recvs += a.op == PipeOp::recv_activation || a.op == PipeOp::recv_grad;
      }
      CHECK(count.size() == size_t(2 * c.v * c.m));
      for (const auto& [key, n] : count) CHECK(n == 1);
      CHECK(pipeline_compute_order(c.kind, c.pp, c.v, c.m, r).size() == count.size());
    }
    // Every boundary between consecutive virtual stages carries one activation and one gradient
    // per micro-batch; with pp = 1 nothing crosses a rank.
    const size_t crossings = c.pp == 1 ? 0 : size_t(c.pp * c.v - 1) * c.m * 2;
    CHECK(sends == crossings);
    CHECK(recvs == crossings);
  }
}

TEST_CASE("stage 0 receives no activation and the last stage sends none", "[pp_schedule]") {
  for (const Case& c : valid_cases()) {
    INFO(describe(c));
    const auto first = pipeline_schedule(c.kind, c.pp, c.v, c.m, 0);
    const auto last = pipeline_schedule(c.kind, c.pp, c.v, c.m, c.pp - 1);
    for (const PipeAction& a : first)
      CHECK_FALSE(((a.op == PipeOp::recv_activation || a.op == PipeOp::send_grad) && a.chunk == 0));
    for (const PipeAction& a : last)
      CHECK_FALSE(((a.op == PipeOp::send_activation || a.op == PipeOp::recv_grad) && a.chunk == c.v - 1));
  }
}

TEST_CASE("the simulated bubble equals the formula", "[pp_schedule]") {
  for (const Case& c : valid_cases()) {
    INFO(describe(c));
    const auto ranks = pipeline_schedule_all_ranks(c.kind, c.pp, c.v, c.m);
    const double ratio = pipeline_bubble_ratio(c.kind, c.pp, c.v, c.m);
    const double fraction = pipeline_bubble_fraction(c.kind, c.pp, c.v, c.m);
    // Blocking sends: exact for any costs with afab and 1f1b, for equal costs with interleaved
    // (see pp_bubble.h); asynchronous point-to-point: exact for any costs.
    std::vector<std::pair<PipeCosts, PipeComm>> runs = {{{1, 1}, PipeComm::blocking}};
    for (PipeCosts costs : {PipeCosts{1, 2}, PipeCosts{2, 3}, PipeCosts{1, 3}}) {
      runs.push_back({costs, PipeComm::async});
      if (c.kind != PipeSchedule::interleaved) runs.push_back({costs, PipeComm::blocking});
    }
    for (const auto& [costs, comm] : runs) {
      const PipeSimReport rep = simulate_pipeline(ranks, c.v, c.m, costs, comm);
      INFO("F=" << costs.forward << " B=" << costs.backward << (comm == PipeComm::async ? " async" : " blocking"));
      REQUIRE(rep.ok());
      CHECK(rep.bubble_ratio() == Approx(ratio).margin(1e-12));
      CHECK(rep.bubble_fraction() == Approx(fraction).margin(1e-12));
      // The makespan the formula implies: v*m chunk computations plus the bubble.
      const int pieces = c.kind == PipeSchedule::interleaved ? c.v * c.m : c.m;
      CHECK(rep.makespan == Approx((pieces + c.pp - 1) * (costs.forward + costs.backward)));
    }
    // Interleaved with blocking sends and B = 2F stalls (see pp_bubble.h) but the formula stays
    // a lower bound: nothing can beat the dependency-only timeline.
    const PipeSimReport blocking = simulate_pipeline(ranks, c.v, c.m, {1, 2}, PipeComm::blocking);
    REQUIRE(blocking.ok());
    CHECK(blocking.bubble_ratio() >= ratio - 1e-12);
  }
}

TEST_CASE("1f1b holds at most pp - rank micro-batches per rank, afab all m", "[pp_schedule]") {
  for (int pp : {2, 4})
    for (int m = 1; m <= 8; m++) {
      INFO("pp=" << pp << " m=" << m);
      const auto f1b1 = simulate_pipeline(pipeline_schedule_all_ranks(PipeSchedule::one_f_one_b, pp, 1, m), 1, m);
      const auto afab = simulate_pipeline(pipeline_schedule_all_ranks(PipeSchedule::afab, pp, 1, m), 1, m);
      REQUIRE(f1b1.ok());
      REQUIRE(afab.ok());
      for (int r = 0; r < pp; r++) {
        CHECK(f1b1.peak_in_flight[r] == std::min(pp - r, m));
        CHECK(afab.peak_in_flight[r] == m);
      }
    }
}

TEST_CASE("1f1b on the last stage runs each forward straight into its backward", "[pp_schedule]") {
  const auto order = pipeline_compute_order(PipeSchedule::one_f_one_b, 4, 1, 8, 3);
  for (size_t i = 0; i < order.size(); i += 2) {
    CHECK(order[i] == PipeAction{PipeOp::forward, int(i / 2), 0, -1});
    CHECK(order[i + 1] == PipeAction{PipeOp::backward, int(i / 2), 0, -1});
  }
}

TEST_CASE("the timeline shows the schedules' shapes", "[pp_schedule]") {
  auto draw = [](PipeSchedule kind, int pp, int v, int m) {
    const auto rep = simulate_pipeline(pipeline_schedule_all_ranks(kind, pp, v, m), v, m, {1, 1});
    REQUIRE(rep.ok());
    return format_pipeline_timeline(rep, v);
  };
  CHECK(draw(PipeSchedule::afab, 2, 1, 3) ==
        "rank 0  012..abc\n"
        "rank 1  .012abc.\n");
  CHECK(draw(PipeSchedule::one_f_one_b, 2, 1, 3) ==
        "rank 0  01.a2b.c\n"
        "rank 1  .0a1b2c.\n");
  // The 1f1b diagram of pp_schedule.h's header.
  CHECK(draw(PipeSchedule::one_f_one_b, 4, 1, 8) ==
        "rank 0  0123...a4b5c6d7e.f.g.h\n"
        "rank 1  .012..a3b4c5d6e7f.g.h.\n"
        "rank 2  ..01.a2b3c4d5e6f7g.h..\n"
        "rank 3  ...0a1b2c3d4e5f6g7h...\n");
  CHECK(draw(PipeSchedule::interleaved, 2, 2, 2) ==
        "rank 0 chunk 0  01......ab\n"
        "rank 0 chunk 1  ..01..ab..\n"
        "rank 1 chunk 0  .01....ab.\n"
        "rank 1 chunk 1  ...01ab...\n");
}

TEST_CASE("schedule names and invalid shapes are config errors naming the keys", "[pp_schedule]") {
  CHECK(parse_pipe_schedule("1f1b") == PipeSchedule::one_f_one_b);
  CHECK(parse_pipe_schedule("afab") == PipeSchedule::afab);
  CHECK(parse_pipe_schedule("interleaved") == PipeSchedule::interleaved);
  CHECK_THROWS_WITH(parse_pipe_schedule("gpipe"), Catch::Contains("parallel.pp_schedule"));

  // Interleaved needs m to be a multiple of pp, as in Megatron.
  for (int pp : {2, 4})
    for (int m = 1; m <= 8; m++) {
      if (m % pp == 0) continue;
      INFO("pp=" << pp << " m=" << m);
      CHECK_THROWS_AS(pipeline_schedule(PipeSchedule::interleaved, pp, 2, m, 0), ConfigError);
      CHECK_THROWS_WITH(pipeline_schedule_all_ranks(PipeSchedule::interleaved, pp, 2, m),
                        Catch::Contains("parallel.pp=" + std::to_string(pp)) &&
                            Catch::Contains("batch.grad_accum_steps=" + std::to_string(m)) &&
                            Catch::Contains("multiple"));
    }
  CHECK_THROWS_WITH(pipeline_schedule(PipeSchedule::interleaved, 4, 1, 8, 0),
                    Catch::Contains("parallel.pp_virtual_stages=1"));
  CHECK_THROWS_WITH(pipeline_schedule(PipeSchedule::interleaved, 1, 2, 8, 0), Catch::Contains("parallel.pp=1"));
  CHECK_THROWS_WITH(pipeline_schedule(PipeSchedule::one_f_one_b, 4, 2, 8, 0),
                    Catch::Contains("parallel.pp_virtual_stages=2") && Catch::Contains("1f1b"));
  CHECK_THROWS_WITH(pipeline_schedule(PipeSchedule::afab, 4, 1, 0, 0), Catch::Contains("batch.grad_accum_steps=0"));
  CHECK_THROWS_AS(pipeline_schedule(PipeSchedule::afab, 4, 1, 8, 4), RuntimeError);
}

TEST_CASE("bubble formulas and the warning", "[pp_schedule]") {
  CHECK(pipeline_bubble_ratio(PipeSchedule::afab, 4, 1, 8) == Approx(0.375));
  CHECK(pipeline_bubble_ratio(PipeSchedule::one_f_one_b, 4, 1, 8) == Approx(0.375));
  CHECK(pipeline_bubble_fraction(PipeSchedule::one_f_one_b, 4, 1, 8) == Approx(3.0 / 11.0));
  CHECK(pipeline_bubble_ratio(PipeSchedule::interleaved, 4, 2, 8) == Approx(3.0 / 16.0));
  CHECK(pipeline_bubble_ratio(PipeSchedule::one_f_one_b, 1, 1, 1) == 0.0);

  const auto warning = pipeline_bubble_warning(PipeSchedule::one_f_one_b, 4, 1, 8);
  REQUIRE(warning);
  CHECK_THAT(*warning, Catch::Contains("pipeline bubble 37.5%") && Catch::Contains("(pp-1)/m") &&
                           Catch::Contains("pp=4") && Catch::Contains("m=8") &&
                           Catch::Contains("batch.global_batch_tokens") && Catch::Contains("batch.micro_batch_size"));
  const auto interleaved = pipeline_bubble_warning(PipeSchedule::interleaved, 4, 2, 4);
  REQUIRE(interleaved);
  CHECK_THAT(*interleaved, Catch::Contains("37.5%") && Catch::Contains("(pp-1)/(v*m)") && Catch::Contains("v=2"));
  CHECK_FALSE(pipeline_bubble_warning(PipeSchedule::one_f_one_b, 4, 1, 12));  // exactly 25%: no warning
  CHECK_FALSE(pipeline_bubble_warning(PipeSchedule::interleaved, 4, 2, 8));   // 18.75%
  CHECK_FALSE(pipeline_bubble_warning(PipeSchedule::afab, 1, 1, 1));
}

// The checker must be able to fail: schedules broken on purpose.
TEST_CASE("the simulator reports a deadlock with the stuck ranks' next actions", "[pp_schedule]") {
  auto ranks = pipeline_schedule_all_ranks(PipeSchedule::one_f_one_b, 2, 1, 4);
  // Rank 1 takes micro-batch 1's activation before its first backward; move that receive after
  // the gradient send, so both ranks try to send to each other at once.
  auto& r1 = ranks[1];
  const auto recv1 = std::find(r1.begin(), r1.end(), PipeAction{PipeOp::recv_activation, 1, 0, 0});
  const auto send0 = std::find(r1.begin(), r1.end(), PipeAction{PipeOp::send_grad, 0, 0, 0});
  REQUIRE(recv1 < send0);
  std::rotate(recv1, recv1 + 1, send0 + 1);
  REQUIRE(simulate_pipeline(ranks, 1, 4, {1, 2}, PipeComm::async).ok());  // fine when sends don't block
  const PipeSimReport rep = simulate_pipeline(ranks, 1, 4, {1, 2}, PipeComm::blocking);
  CHECK(rep.status == PipeSimReport::Status::deadlock);
  CHECK_THAT(rep.error, Catch::Contains("rank 0 waits at send_activation(micro 1, chunk 0) -> rank 1") &&
                            Catch::Contains("rank 1 waits at send_grad(micro 0, chunk 0) -> rank 0"));
}

TEST_CASE("the simulator rejects misordered links, missing inputs and missing work", "[pp_schedule]") {
  const auto good = pipeline_schedule_all_ranks(PipeSchedule::afab, 2, 1, 2);
  const PipeAction send0{PipeOp::send_activation, 0, 0, 1};
  const PipeAction send1{PipeOp::send_activation, 1, 0, 1};

  SECTION("two sends swapped: tagless matching would hand micro-batch 1 to micro-batch 0's receive") {
    auto ranks = good;
    auto& r0 = ranks[0];
    auto first = std::find(r0.begin(), r0.end(), send0);
    REQUIRE(first != r0.end());
    r0.erase(first);
    r0.insert(std::find(r0.begin(), r0.end(), send1) + 1, send0);
    for (PipeComm comm : {PipeComm::blocking, PipeComm::async}) {
      const auto rep = simulate_pipeline(ranks, 1, 2, {}, comm);
      CHECK(rep.status == PipeSimReport::Status::invalid);
      CHECK_THAT(rep.error, Catch::Contains("wrong data"));
    }
  }
  SECTION("a receive dropped: the forward runs without its input") {
    auto ranks = good;
    auto& r1 = ranks[1];
    r1.erase(std::find(r1.begin(), r1.end(), PipeAction{PipeOp::recv_activation, 0, 0, 0}));
    ranks[0].erase(std::find(ranks[0].begin(), ranks[0].end(), send0));
    const auto rep = simulate_pipeline(ranks, 1, 2);
    CHECK(rep.status == PipeSimReport::Status::invalid);
    CHECK_THAT(rep.error, Catch::Contains("rank 1 forward(micro 0, chunk 0)") &&
                              Catch::Contains("without receiving its input activation"));
  }
  SECTION("one micro-batch's backward left out everywhere") {
    auto ranks = good;
    auto drop = [&](int r, PipeAction a) {
      auto it = std::find(ranks[r].begin(), ranks[r].end(), a);
      REQUIRE(it != ranks[r].end());
      ranks[r].erase(it);
    };
    drop(1, {PipeOp::backward, 1, 0, -1});
    drop(1, {PipeOp::send_grad, 1, 0, 0});
    drop(0, {PipeOp::recv_grad, 1, 0, 1});
    drop(0, {PipeOp::backward, 1, 0, -1});
    const auto rep = simulate_pipeline(ranks, 1, 2);
    CHECK(rep.status == PipeSimReport::Status::invalid);
    CHECK_THAT(rep.error, Catch::Contains("micro-batch 1 is never backwarded at virtual stage 0"));
  }
  SECTION("a send to the wrong peer") {
    auto ranks = pipeline_schedule_all_ranks(PipeSchedule::one_f_one_b, 4, 1, 4);
    auto& r1 = ranks[1];
    auto it = std::find_if(r1.begin(), r1.end(), [](const PipeAction& a) { return a.op == PipeOp::send_activation; });
    it->peer = 3;
    const auto rep = simulate_pipeline(ranks, 1, 4);
    CHECK(rep.status == PipeSimReport::Status::invalid);
    CHECK_THAT(rep.error, Catch::Contains("is on rank 2"));
  }
}
