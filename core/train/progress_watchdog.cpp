#include "core/train/progress_watchdog.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "core/common/error.h"
#include "core/dist/comm_wait.h"
#include "core/dist/gpu_comm.h"
#include "core/common/console.h"

namespace pt {

namespace {

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.1f s" : "%.0f s", s);
  return buf;
}

std::string factor(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

}  // namespace

ProgressWatchdog::ProgressWatchdog(double timeout_s, Probe probe, OnHang on_hang, double slow_factor, double poll_s)
    : timeout_s_(timeout_s),
      slow_factor_(slow_factor),
      poll_s_(poll_s > 0 ? poll_s : std::min(1.0, timeout_s / 8)),
      probe_(std::move(probe)),
      on_hang_(std::move(on_hang)),
      last_beat_(Clock::now()) {
  check(timeout_s > 0, "ProgressWatchdog: the timeout must be positive");
  check(static_cast<bool>(on_hang_), "ProgressWatchdog: on_hang is required");
  thread_ = std::thread([this] { watch(); });
}

ProgressWatchdog::~ProgressWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ProgressWatchdog::beat(std::string activity) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  if (beaten_ && !in_long_work_)
    longest_gap_s_ = std::max(longest_gap_s_, std::chrono::duration<double>(now - last_beat_).count());
  beaten_ = true;
  last_beat_ = now;
  activity_ = std::move(activity);
}

ProgressWatchdog::LongWork::LongWork(ProgressWatchdog* w, std::string activity, double limit_s, std::string limit_key)
    : w_(w) {
  if (!w_) return;
  std::lock_guard<std::mutex> lock(w_->mu_);
  check(!w_->in_long_work_, "ProgressWatchdog: one LongWork at a time (" + w_->long_activity_ + " is running)");
  w_->in_long_work_ = true;
  w_->long_limit_s_ = limit_s;
  w_->long_activity_ = std::move(activity);
  w_->long_limit_key_ = std::move(limit_key);
  w_->long_started_ = Clock::now();
}

ProgressWatchdog::LongWork::~LongWork() {
  if (!w_) return;
  std::lock_guard<std::mutex> lock(w_->mu_);
  w_->in_long_work_ = false;
  // The work's time is not the activity's: its clock restarts (and the gap it spans is not a step).
  w_->last_beat_ = Clock::now();
}

double ProgressWatchdog::limit_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_locked();
}

double ProgressWatchdog::limit_locked() const { return std::max(timeout_s_, slow_factor_ * longest_gap_s_); }

bool ProgressWatchdog::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

void ProgressWatchdog::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto poll = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(poll_s_));
  while (!stop_) {
    wake_.wait_for(lock, poll, [this] { return stop_; });
    if (stop_) return;
    std::string reason;
    // The probe may take a moment (it asks NCCL): not under the lock, so beats never wait on it.
    if (probe_) {
      lock.unlock();
      std::string error = probe_();
      lock.lock();
      if (stop_) return;
      if (!error.empty()) reason = error + " (during " + activity_ + ")";
    }
    const Clock::time_point now = Clock::now();
    const double waited = std::chrono::duration<double>(now - last_beat_).count();
    const double working = std::chrono::duration<double>(now - long_started_).count();
    if (reason.empty() && in_long_work_ && long_limit_s_ > 0 && working > long_limit_s_)
      reason = "no progress for " + seconds(working) + ": " + long_activity_ + " has not finished (the limit is " +
               seconds(long_limit_s_) + ": " + long_limit_key_ +
               "). A rank's storage is stalled, or a rank is stuck or gone";
    if (reason.empty() && !in_long_work_ && waited > limit_locked())
      reason = "no progress for " + seconds(waited) + ": " + activity_ + " has not finished (the limit is " +
               seconds(limit_locked()) + ": run.hang_timeout_s, or " + factor(slow_factor_) +
               " times the slowest step when that is longer). A rank is stuck or gone, or the ranks disagree on "
               "their collectives";
    if (reason.empty()) continue;
    fired_ = true;
    lock.unlock();
    on_hang_(reason);
    return;
  }
}

double hang_timeout_seconds(double configured, int world_size) {
  if (configured >= 0) return configured;
  return world_size > 1 ? 600.0 : 0.0;
}

std::unique_ptr<ProgressWatchdog> start_rank_watchdog(double hang_timeout_s, const World& world) {
  const double timeout = hang_timeout_seconds(hang_timeout_s, world.size);
  if (timeout <= 0) return nullptr;
  const std::string who = world.size > 1 ? "rank " + std::to_string(world.rank) + ": " : "";
  return std::make_unique<ProgressWatchdog>(timeout, nccl_async_error, [who](const std::string& reason) {
    // Whom this rank is waiting for (comm_wait.h): the rank or group that stopped answering.
    const std::string wait = describe_comm_wait();
    // print_error takes no stdio lock: the stuck thread may hold stdout's (a full pipe), and this
    // must not wait on it. One write, so the lines of several ranks sharing a terminal stay whole.
    print_error(who + reason + (wait.empty() ? "" : "; " + wait) +
                ". Ending this rank (exit code 1); continue from the newest checkpoint with --set "
                "checkpoint.resume=auto");
    std::_Exit(1);
  });
}

}  // namespace pt
