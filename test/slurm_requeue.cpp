// scripts/slurm/picotrain.sbatch under a real Slurm (Debian's slurm-wlm, started on this machine
// by scripts/slurm/local_cluster.sh: munged, slurmctld, slurmd; one node, two "GPUs"), as a
// user runs it: `sbatch` with the script unchanged, two tasks started by srun over PMIx, the CPU
// backend (DEVICE=cpu). What docs/multi-rank.md's "Running under Slurm" promises, each case against an
// uninterrupted job of the same run, whose per-step losses and gradient norms every case must
// equal bit for bit:
//  - the pre-emption warning (SIGUSR1 to the batch script, as --signal=B:USR1@120 sends it):
//    every task checkpoints, the script requeues the job, the job starts again and resumes;
//  - `scontrol requeue`: Slurm stops the tasks with SIGTERM, they checkpoint, Slurm requeues;
//  - `scancel`: the tasks checkpoint on SIGTERM and the job ends CANCELLED, not requeued;
//    submitting it again resumes from that checkpoint.
// Slurm makes a requeued job eligible again only about two minutes later (measured: 121 s with
// 22.05); the test lets it start two seconds after it is pending, with `scontrol update
// StartTime=now` as an administrator can (sooner, slurmd may refuse the launch: see
// wait_for_state), and says how long each job took.
// Needs root and Slurm (scripts/setup.sh --cluster): exits 77 (skipped) with the reason otherwise.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/data/shard.h"
#include "run_test_support.h"

using Catch::Matchers::Contains;
using pt::test::Launch;
using pt::test::run_command;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kScripts = std::string(PICOTRAIN_SOURCE_DIR) + "/scripts/slurm/";

std::string q(const std::string& s) { return "'" + s + "'"; }

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The cluster, up for the test's lifetime; every daemon and job stopped whatever happens.
struct LocalCluster {
  fs::path dir;
  LocalCluster() {
    dir = fs::temp_directory_path() / ("picotrain_slurm_" + std::to_string(::getpid()));
    const Launch up = run_command(kScripts + "local_cluster.sh up " + q(dir.string()), 60);
    if (up.exit_code == 77) {
      std::cout << "slurm_requeue: skipped: " << up.output;
      std::exit(77);
    }
    INFO(up.output);
    REQUIRE(up.exit_code == 0);
    setenv("SLURM_CONF", (dir / "slurm.conf").c_str(), 1);
  }
  ~LocalCluster() {
    run_command(kScripts + "local_cluster.sh down " + q(dir.string()), 60);
    fs::remove_all(dir);
  }
};

// A tiny GPT-2 on random bytes: 80 steps of a few tens of milliseconds, one line of metrics each.
struct Job {
  fs::path dir;
  explicit Job(const fs::path& cluster_dir) : dir(cluster_dir / "job") {
    fs::create_directories(dir);
    std::mt19937 rng(5);
    std::vector<uint16_t> tokens(8000);
    for (auto& t : tokens) t = rng() % 256;
    pt::write_shard((dir / "s_train_000000.bin").string(), tokens);
    std::ofstream(dir / "c.json") << R"({
      "run": {"name": "slurm"},
      "model": {"n_layers": 4, "d_model": 64, "n_heads": 4, "vocab_size": 256, "max_seq_len": 64},
      "batch": {"micro_batch_size": 4, "seq_len": 32},
      "schedule": {"total_steps": 80, "warmup_steps": 4},
      "data": {"train": ")" << (dir / "s_train_*.bin").string() << R"("},
      "logging": {"every_steps": 1, "peak_tflops": 1.0}
    })";
  }
  // Submits the unchanged script for run directory `run` on one node, two tasks, one CPU each;
  // returns the job id.
  std::string submit(const std::string& run) const {
    const std::string env = "env PICOTRAIN=" + q(PICOTRAIN_BIN) + " RUN_DIR=" + q((dir / run).string()) +
                            " DEVICE=cpu CKPT_EVERY=1000";
    const Launch s = run_command(env + " sbatch --parsable --job-name=" + run +
                                     " --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --chdir=" + q(dir.string()) +
                                     " --output=" + q((dir / (run + "-%j.out")).string()) + " " + q(kScripts) +
                                     "picotrain.sbatch " + q((dir / "c.json").string()),
                                 60);
    INFO(s.output);
    REQUIRE(s.exit_code == 0);
    return s.output.substr(0, s.output.find_first_of(";\n"));
  }
  std::string log(const std::string& run, const std::string& id) const {
    return read_file(dir / (run + "-" + id + ".out"));
  }
  size_t metric_lines(const std::string& run) const {
    std::ifstream in(dir / run / "metrics.jsonl");
    size_t n = 0;
    for (std::string line; std::getline(in, line);) n++;
    return n;
  }
  // Step -> (loss, grad norm) as written (the last line of a step wins: a resumed run rewrites
  // the steps after its checkpoint).
  std::map<int, std::pair<double, double>> losses(const std::string& run) const {
    std::map<int, std::pair<double, double>> out;
    std::ifstream in(dir / run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) out[j["step"].get<int>()] = {j["loss"].get<double>(), j["grad_norm"].get<double>()};
    }
    return out;
  }
};

// A field of `scontrol show job ID` ("JobState", "Restarts", ...).
std::string job_field(const std::string& id, const std::string& field) {
  const Launch l = run_command("scontrol show job " + id, 30);
  const size_t at = l.output.find(field + "=");
  if (at == std::string::npos) return "";
  const size_t begin = at + field.size() + 1;
  return l.output.substr(begin, l.output.find_first_of(" \n", begin) - begin);
}

// The local cluster's directory (its slurm.conf, state and logs).
fs::path cluster_dir() { return fs::path(getenv("SLURM_CONF")).parent_path(); }

// Waits (at most `limit_s`) for the job to reach `state` (COMPLETED, CANCELLED) after `restarts`
// requeues, starting a requeued job soon after it is pending instead of after Slurm's delay.
// On a timeout, or on a state the job cannot leave (FAILED, or the wrong end state), fails with
// what there is to know: the job as slurmctld sees it and the job's log (`log`).
void wait_for_state(const std::string& id, const std::string& state, int restarts, int limit_s,
                    const std::function<std::string()>& log) {
  const auto start = Clock::now();
  std::optional<Clock::time_point> pending_since;  // requeued and waiting to start again
  std::string now;
  while ((now = job_field(id, "JobState")) != state || job_field(id, "Restarts") != std::to_string(restarts)) {
    const bool ended = now == "FAILED" || now == "TIMEOUT" || now == "NODE_FAIL" || now == "OUT_OF_MEMORY" ||
                       (now == "COMPLETED" && state != "COMPLETED") || (now == "CANCELLED" && state != "CANCELLED");
    if (ended || Clock::now() - start >= std::chrono::seconds(limit_s)) {
      INFO("scontrol show job " << id << ":\n" << run_command("scontrol show job " + id, 30).output);
      INFO("the job's log:\n" << log());
      const std::string logs = q((cluster_dir() / "log").string());
      INFO("what slurmctld logged of it:\n"
           << run_command("grep -h -E 'JobId=" + id + "( |$)' " + logs + "/slurmctld.log | tail -n 40", 30).output);
      INFO("the end of slurmd's log:\n" << run_command("tail -n 40 " + logs + "/slurmd.log", 30).output);
      FAIL("job " << id << " is " << now << " (restarts " << job_field(id, "Restarts") << ") after "
                  << std::chrono::duration<double>(Clock::now() - start).count() << " s, waiting for " << state
                  << " after " << restarts << " restart(s)");
    }
    // Not at once: slurmd refuses a launch whose credential is from the same second as the
    // requeue's kill ("Job N already killed, do not launch batch job": the job ends FAILED, exit
    // 1), which Slurm's own delay after a requeue never meets. Two seconds after it is seen
    // pending is safely past that second.
    if (now == "PENDING" && job_field(id, "Restarts") != "0") {
      if (!pending_since) pending_since = Clock::now();
      if (Clock::now() - *pending_since > std::chrono::seconds(2))
        run_command("scontrol update JobId=" + id + " StartTime=now");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::cout << "job " << id << ": " << state << " after "
            << std::chrono::duration<double>(Clock::now() - start).count() << " s\n";
}

// Waits until no process of the job is left (squeue lists running and completing jobs only).
void wait_until_gone(const std::string& id) {
  const auto start = Clock::now();
  while (!run_command("squeue -h -j " + id, 30).output.empty()) {
    REQUIRE(Clock::now() - start < std::chrono::seconds(120));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// Waits until the run has logged `steps` steps (the job is then mid-run).
void wait_for_steps(const Job& job, const std::string& run, size_t steps) {
  const auto start = Clock::now();
  while (job.metric_lines(run) < steps) {
    REQUIRE(Clock::now() - start < std::chrono::seconds(120));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

TEST_CASE("picotrain.sbatch under a real Slurm: pre-emption, requeue and scancel resume bit for bit", "[slurm]") {
  const LocalCluster cluster;
  const Job job(cluster.dir);

  const std::string straight = job.submit("straight");
  wait_for_state(straight, "COMPLETED", 0, 180, [&] { return job.log("straight", straight); });
  const std::string straight_log = job.log("straight", straight);
  INFO(straight_log);
  CHECK_THAT(straight_log, Contains("2 task(s)") && Contains("world 2 = dp 2") && Contains("the run is done"));
  const auto expected = job.losses("straight");
  REQUIRE(expected.size() == 80);

  // The three cases one after another on the one cluster (each job takes both of its CPUs).
  // Each submits run `run`, sends `interrupt` with the job id once the run is mid-way, and waits
  // for the job to end in `state` after `restarts` requeues; returns the job's log.
  auto interrupted = [&](const std::string& run, const std::string& interrupt, const std::string& state,
                         int restarts) {
    const std::string id = job.submit(run);
    wait_for_steps(job, run, 20);
    REQUIRE(run_command(interrupt + " " + id).exit_code == 0);
    wait_for_state(id, state, restarts, 180, [&] { return job.log(run, id); });
    wait_until_gone(id);  // the tasks have written their checkpoint and exited
    return job.log(run, id);
  };
  {
    // What --signal=B:USR1@120 does before the time limit, or a site before a pre-emption.
    const std::string log = interrupted("warned", "scancel --batch --signal=USR1", "COMPLETED", 1);
    INFO("the pre-emption warning: checkpoint, requeue, resume\n" << log);
    CHECK_THAT(log, Contains("SIGUSR1: the job ends soon") && Contains("(restart 1)") &&
                        Contains("resumed at step") && Contains("the run is done"));
    CHECK(job.losses("warned") == expected);
  }
  {
    const std::string log = interrupted("requeued", "scontrol requeue", "COMPLETED", 1);
    INFO("scontrol requeue: SIGTERM, checkpoint, Slurm requeues, resume\n" << log);
    CHECK_THAT(log, Contains("SIGTERM: finishing this step") && Contains("resumed at step"));
    CHECK(job.losses("requeued") == expected);
  }
  {
    const std::string log = interrupted("cancelled", "scancel", "CANCELLED", 0);
    INFO("scancel: the tasks checkpoint, the job ends; submitted again it resumes\n" << log);
    CHECK_THAT(log, Contains("SIGTERM: finishing this step") && Contains("stopped   | SIGTERM after step"));
    const std::string again = job.submit("cancelled");
    wait_for_state(again, "COMPLETED", 0, 180, [&] { return job.log("cancelled", again); });
    const std::string log2 = job.log("cancelled", again);
    INFO(log2);
    CHECK_THAT(log2, Contains("resumed at step") && Contains("the run is done"));
    CHECK(job.losses("cancelled") == expected);
  }
}
