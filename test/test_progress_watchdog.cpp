// ProgressWatchdog on its own, with a recording on_hang instead of ending the process: regular
// beats keep it quiet; silence after a beat fires it, naming the activity, no sooner than the
// limit; a pause stops the clock and restarts it when it ends; a slow step raises the limit;
// a probe's error fires it at once; destruction is prompt. The margins are wide (a beat every
// 20 ms against limits of 0.4 s and more) so that a busy machine does not make a beat late
// enough to look like a hang.
#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "core/train/progress_watchdog.h"

using namespace pt;
using Catch::Matchers::Contains;
using Clock = std::chrono::steady_clock;

namespace {

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What on_hang was called with, and when.
struct Record {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  std::string reason;
  Clock::time_point at;

  ProgressWatchdog::OnHang on_hang() {
    return [this](const std::string& r) {
      std::lock_guard<std::mutex> lock(mu);
      calls++;
      reason = r;
      at = Clock::now();
      cv.notify_all();
    };
  }
  // Waits up to `s` seconds for the first call; true when it came.
  bool wait(double s) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(s), [this] { return calls > 0; });
  }
  int count() {
    std::lock_guard<std::mutex> lock(mu);
    return calls;
  }
};

constexpr double kPoll = 0.01;

}  // namespace

TEST_CASE("watchdog: regular beats keep it quiet", "[watchdog]") {
  Record rec;
  ProgressWatchdog w(0.4, {}, rec.on_hang(), 4.0, kPoll);
  for (int i = 0; i < 40; i++) {
    w.beat("step " + std::to_string(i));
    sleep_s(0.02);
  }
  CHECK(rec.count() == 0);
  CHECK_FALSE(w.fired());
}

TEST_CASE("watchdog: silence after a beat fires it once, after the limit, naming the activity", "[watchdog]") {
  Record rec;
  ProgressWatchdog w(0.3, {}, rec.on_hang(), 4.0, kPoll);
  const Clock::time_point t0 = Clock::now();
  w.beat("step 7");
  REQUIRE(rec.wait(10));
  CHECK(std::chrono::duration<double>(rec.at - t0).count() >= 0.3);
  CHECK_THAT(rec.reason, Contains("no progress for") && Contains("step 7 has not finished") &&
                             Contains("run.hang_timeout_s"));
  CHECK(w.fired());
  sleep_s(0.1);
  CHECK(rec.count() == 1);  // once: the thread ends after firing
}

TEST_CASE("watchdog: long work stops the step clock, which restarts when the work ends", "[watchdog]") {
  Record rec;
  ProgressWatchdog w(0.4, {}, rec.on_hang(), 4.0, kPoll);
  w.beat("step 1");
  {
    ProgressWatchdog::LongWork save(&w, "the save of step 1");  // no limit of its own
    sleep_s(1.0);  // far past the step limit
  }
  const Clock::time_point resumed = Clock::now();
  sleep_s(0.1);
  CHECK(rec.count() == 0);
  REQUIRE(rec.wait(10));
  CHECK(std::chrono::duration<double>(rec.at - resumed).count() >= 0.39);
  CHECK_THAT(rec.reason, Contains("step 1"));
  CHECK(w.limit_s() == Approx(0.4));  // the work's time is no step's: the limit is not raised by it
  ProgressWatchdog::LongWork none(nullptr, "nothing");  // no watchdog: nothing to do
}

TEST_CASE("watchdog: long work past its own limit fires it, naming the work and the limit's key", "[watchdog]") {
  {
    // Within its limit (longer than the step limit), the work does not fire it.
    Record rec;
    ProgressWatchdog w(0.2, {}, rec.on_hang(), 4.0, kPoll);
    w.beat("step 4");
    {
      ProgressWatchdog::LongWork save(&w, "the save of the checkpoint of step 4", 1.0, "checkpoint.save_timeout_s");
      sleep_s(0.6);
    }
    CHECK(rec.count() == 0);
  }
  Record rec;
  ProgressWatchdog w(100.0, {}, rec.on_hang(), 4.0, kPoll);
  w.beat("step 5");
  const Clock::time_point t0 = Clock::now();
  ProgressWatchdog::LongWork save(&w, "the save of the checkpoint of step 5", 0.3, "checkpoint.save_timeout_s");
  REQUIRE(rec.wait(10));
  const double after = std::chrono::duration<double>(rec.at - t0).count();
  CHECK(after >= 0.29);
  CHECK(after < 5.0);  // not the 100 s step limit
  CHECK_THAT(rec.reason, Contains("the save of the checkpoint of step 5 has not finished") &&
                             Contains("the limit is 0.3 s: checkpoint.save_timeout_s"));
  CHECK(rec.count() == 1);
}

TEST_CASE("watchdog: a slow step raises the limit to slow_factor times it", "[watchdog]") {
  Record rec;
  ProgressWatchdog w(0.2, {}, rec.on_hang(), 4.0, kPoll);
  CHECK(w.limit_s() == Approx(0.2));
  w.beat("step 1");
  sleep_s(0.15);  // under the timeout: step 1 is slow but not hung
  w.beat("step 2");
  const double limit = w.limit_s();
  CHECK(limit >= 4 * 0.15);
  const Clock::time_point t2 = Clock::now();
  sleep_s(0.35);  // past the configured timeout, inside the raised limit
  CHECK(rec.count() == 0);
  REQUIRE(rec.wait(10));
  CHECK(std::chrono::duration<double>(rec.at - t2).count() >= limit - 0.01);
  CHECK_THAT(rec.reason, Contains("step 2"));
}

TEST_CASE("watchdog: a probe's error fires it at once", "[watchdog]") {
  Record rec;
  std::atomic<int> polls{0};
  auto probe = [&]() -> std::string { return ++polls < 5 ? "" : "NCCL: remote process exited"; };
  const Clock::time_point t0 = Clock::now();
  ProgressWatchdog w(100.0, probe, rec.on_hang(), 4.0, kPoll);
  w.beat("step 3");
  REQUIRE(rec.wait(10));
  CHECK(std::chrono::duration<double>(rec.at - t0).count() < 5.0);  // not the 100 s timeout
  CHECK(rec.reason == "NCCL: remote process exited (during step 3)");
}

TEST_CASE("watchdog: destruction is prompt and a disabled config is rejected", "[watchdog]") {
  Record rec;
  const Clock::time_point t0 = Clock::now();
  {
    ProgressWatchdog w(100.0, {}, rec.on_hang(), 4.0, 1.0);  // wakes once a second
    w.beat("step 1");
  }
  CHECK(since(t0) < 0.5);
  CHECK(rec.count() == 0);
  CHECK_THROWS(ProgressWatchdog(0.0, {}, rec.on_hang()));
  CHECK_THROWS(ProgressWatchdog(1.0, {}, {}));
}

TEST_CASE("watchdog: run.hang_timeout_s -1 means 600 s with several ranks and none with one", "[watchdog]") {
  CHECK(hang_timeout_seconds(-1, 1) == 0);
  CHECK(hang_timeout_seconds(-1, 2) == 600);
  CHECK(hang_timeout_seconds(0, 8) == 0);
  CHECK(hang_timeout_seconds(30, 1) == 30);
  CHECK(start_rank_watchdog(-1, World{0, 1, 0, 1}) == nullptr);
  CHECK(start_rank_watchdog(0, World{0, 4, 0, 4}) == nullptr);
  const auto w = start_rank_watchdog(-1, World{1, 4, 1, 4});
  REQUIRE(w != nullptr);
  CHECK(w->limit_s() == 600);
}
