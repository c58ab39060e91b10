// Stop signals: the handler only records the signal; a second SIGINT exits at once with 130;
// and the real binary, sent SIGTERM mid-run, finishes its step, checkpoints, exits 0, and a
// resumed run continues the same trajectory as a run that was never stopped.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "ckpt_test_support.h"
#include "run_test_support.h"
#include "core/ckpt/stop_signal.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

TEST_CASE("SIGTERM, SIGINT and SIGUSR1 request a stop; the handlers are restored after", "[ckpt]") {
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) {
    DYNAMIC_SECTION(ckpt::signal_name(sig)) {
      struct sigaction before{};
      sigaction(sig, nullptr, &before);  // Catch2's own handler, or the default
      {
        const ckpt::StopSignals guard;
        CHECK_FALSE(ckpt::stop_requested());
        std::raise(sig);  // delivered to this thread before raise returns
        CHECK(ckpt::stop_requested());
        CHECK(ckpt::stop_signal() == sig);
      }
      struct sigaction now{};
      sigaction(sig, nullptr, &now);
      CHECK(now.sa_handler == before.sa_handler);
    }
  }
}

TEST_CASE("a second SIGINT exits at once with status 130", "[ckpt]") {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const ckpt::StopSignals guard;
    std::raise(SIGINT);
    if (!ckpt::stop_requested()) _exit(3);
    std::raise(SIGTERM);  // a repeated TERM (e.g. from a launcher) does not end the stop
    std::raise(SIGINT);
    _exit(0);  // not reached
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
}

namespace {

// The "loss" of every record in a metrics.jsonl file, by step.
std::map<int, double> losses(const std::string& path) {
  std::map<int, double> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    out[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return out;
}

}  // namespace

TEST_CASE("SIGTERM mid-run: exit 0 with a checkpoint at that step; the resumed run continues the trajectory", "[ckpt]") {
  CkptFixture fx("ckpt_sigterm");
  const int total = 200;
  // A larger micro-batch than the other tests, so a step takes a few ms and the signal
  // lands mid-run however fast the machine.
  nlohmann::json j = fx.json("stopped");
  j["batch"] = {{"micro_batch_size", 4}, {"seq_len", 64}, {"global_batch_tokens", 256}};
  j["schedule"]["total_steps"] = total;
  const std::string cfg = (fx.dir / "cfg.json").string();
  std::ofstream(cfg) << j.dump();
  const std::string err = (fx.dir / "stderr.txt").string();

  // The reference: the same run, never stopped.
  Child straight = start_train(cfg, {"run.out_dir=" + (fx.dir / "straight").string()}, err);
  drain(straight.out);
  REQUIRE(wait_exit_code(straight.pid) == 0);

  // Stopped by SIGTERM once the third step is logged.
  Child run = start_train(cfg, {}, err);
  int steps_seen = 0;
  std::string log = read_until_step_lines(run.out, 3, &steps_seen);
  REQUIRE(steps_seen == 3);
  kill(run.pid, SIGTERM);
  log += drain(run.out);
  CHECK(wait_exit_code(run.pid) == 0);
  CHECK_THAT(read_text(err), Contains("SIGTERM"));
  CHECK_THAT(log, Contains("stopped   | SIGTERM after step"));

  const auto stopped = losses((fx.dir / "stopped" / "metrics.jsonl").string());
  REQUIRE(!stopped.empty());
  const int stop_step = stopped.rbegin()->first;
  INFO("stopped after step " << stop_step);
  REQUIRE(stop_step < total);  // else the run finished before the signal arrived
  CHECK(read_text(fx.ckpt_dir("stopped") + "/latest") == "step_" + std::string(8 - std::to_string(stop_step).size(), '0') +
                                                              std::to_string(stop_step) + "\n");

  // Resumed: it picks up at stop_step and its metrics file continues the stopped run's.
  Child resumed = start_train(cfg, {"checkpoint.resume=auto"}, err);
  const std::string resumed_log = drain(resumed.out);
  REQUIRE(wait_exit_code(resumed.pid) == 0);
  CHECK_THAT(resumed_log, Contains("resumed at step " + std::to_string(stop_step)));

  const auto reference = losses((fx.dir / "straight" / "metrics.jsonl").string());
  const auto continued = losses((fx.dir / "stopped" / "metrics.jsonl").string());
  REQUIRE(reference.size() == static_cast<size_t>(total));
  REQUIRE(continued.size() == static_cast<size_t>(total));
  int differing = 0;
  for (const auto& [step, loss] : reference) differing += continued.at(step) != loss;  // bitwise, via JSON
  CHECK(differing == 0);
}
