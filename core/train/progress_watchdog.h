// ProgressWatchdog: ends a rank that has stopped making progress, so that a hung run ends, and a
// launcher or the speedrun can restart it from the newest checkpoint, instead of holding its
// machines forever.
//
// A multi-rank run hangs rather than fails when one rank stops while the others wait for it in a
// collective: a rank stuck in a driver call or a dead GPU, a peer whose process vanished without
// the launcher noticing, a network that drops NCCL's traffic, or a bug that makes the ranks call
// different collectives. No error is ever raised; every rank just waits. The trainer calls beat()
// as each unit of progress starts (a step, a validation pass); a thread of this class wakes a
// few times per limit and, when the last beat is older than the limit, or when `probe` reports an
// error (NCCL's asynchronous errors), calls `on_hang` with a message naming what was running and
// for how long. The trainer's on_hang prints it and ends the process (exit code 1), which makes
// mpirun end the other ranks; under a launcher that does not, every rank's own watchdog ends it.
//
// The limit is the configured timeout, or `slow_factor` times the longest gap between two
// beats seen so far when that is longer, so a layout whose steps are slow (a large model on
// CPUs) is not taken for a hung one once its first step has finished. Work of its own length
// that is not a step (writing a checkpoint to a slow file system) runs inside a LongWork: the
// step clock stops, and the work has a limit of its own (checkpoint.save_timeout_s), so that a
// rank lost while the others wait in a save's agreements still ends the run, with a message.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <memory>
#include <thread>

#include "core/dist/world.h"

namespace pt {

class ProgressWatchdog {
 public:
  // An error that is already known ("" when there is none); polled with the clock.
  using Probe = std::function<std::string()>;
  // Called once, from the watchdog's thread, with the reason. It may end the process.
  using OnHang = std::function<void(const std::string& reason)>;

  // timeout_s > 0. poll_s: how often the thread wakes (0: timeout_s / 8, at most 1 s).
  ProgressWatchdog(double timeout_s, Probe probe, OnHang on_hang, double slow_factor = 4.0, double poll_s = 0);
  ~ProgressWatchdog();
  ProgressWatchdog(const ProgressWatchdog&) = delete;
  ProgressWatchdog& operator=(const ProgressWatchdog&) = delete;

  // `activity` starts now (e.g. "step 12"): the clock restarts.
  void beat(std::string activity);

  // While a LongWork lives the step clock does not run (it restarts when the work ends), and
  // the work fires the watchdog when it lasts longer than limit_s (0: never), with a message
  // naming `activity` and the config key that sets the limit (`limit_key`). One at a time.
  class LongWork {
   public:
    // w nullptr: no watchdog, nothing to do.
    LongWork(ProgressWatchdog* w, std::string activity, double limit_s = 0, std::string limit_key = "");
    ~LongWork();
    LongWork(const LongWork&) = delete;
    LongWork& operator=(const LongWork&) = delete;

   private:
    ProgressWatchdog* w_;
  };

  // The current limit in seconds: max(timeout, slow_factor * the longest gap between beats).
  double limit_s() const;
  double slow_factor() const { return slow_factor_; }
  // Whether on_hang has been called.
  bool fired() const;

 private:
  using Clock = std::chrono::steady_clock;
  void watch();
  double limit_locked() const;

  const double timeout_s_, slow_factor_, poll_s_;
  const Probe probe_;
  const OnHang on_hang_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false, fired_ = false;
  bool in_long_work_ = false;
  double long_limit_s_ = 0;  // the LongWork's limit (0: none)
  std::string long_activity_, long_limit_key_;
  Clock::time_point long_started_;
  bool beaten_ = false;  // a beat has come: gaps between beats count from the second one
  Clock::time_point last_beat_;
  double longest_gap_s_ = 0;
  std::string activity_ = "start-up";
  std::thread thread_;  // last: started when everything above is set
};

// run.hang_timeout_s as a timeout in seconds: -1 is 600 with several ranks and 0 (none) with one.
double hang_timeout_seconds(double configured, int world_size);

// The training run's watchdog (nullptr when the timeout is 0): NCCL's asynchronous errors are
// its probe, and on a hang it prints "error: rank R: <reason>" on stderr and ends the process
// with exit code 1 at once (std::_Exit: no destructor may wait on the stuck collective).
std::unique_ptr<ProgressWatchdog> start_rank_watchdog(double hang_timeout_s, const World& world);

}  // namespace pt
