// Faults between hosts, with the ranks of a dp 2 / ZeRO-1 run on two test hosts (one each, MPI
// over TCP; cluster_test_support.h), each with what must happen:
//  - host 1's link goes down mid-run: rank 0's watchdog ends it within its limit, naming rank 1
//    on host 1 as the one it waits for, and mpirun ends; with the link up again the run resumes
//    from the newest committed checkpoint and finishes bit-identical to an uninterrupted run;
//  - host 1's link goes down during a save: checkpoint.save_timeout_s ends it (a save is not
//    watched by the step's limit), naming the save and rank 1, and the run resumes bit-exact;
//  - rank 1 is SIGKILLed while a checkpoint is being saved: the newest committed checkpoint is
//    still there, every committed one reads back whole, and resume is bit-exact;
//  - the checkpoint file system (a small tmpfs) fills up during a save: an error naming the path,
//    the earlier checkpoints intact (and a resume from them bit-exact);
//  - host 1's link is slow (a rate limit): the run is slower and its losses are the same.
// The uninterrupted run is the same layout on one host (bitwise equal: cluster_parity). Each case
// prints what it measured on lines starting "figure |" (docs/multi-rank.md, "Ranks on separate hosts").
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>

#include "cluster_test_support.h"
#include "core/ckpt/checkpoint_dir.h"
#include "core/ckpt/checkpoint_reader.h"
#include "launch_test_support.h"

using namespace pt::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kSteps = 12;
// Every run of this file: 12 steps of 64 tokens, a checkpoint every 2 (unless a case says), a 2 s
// hang limit.
const std::string kSets = "--set schedule.total_steps=12 --set checkpoint.every_steps=2 --set parallel.zero_stage=1 "
                          "--set run.hang_timeout_s=2 --set logging.every_steps=1 --set optim.lr=3e-3";

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The data and config every case trains on, and the one-host run it must end up equal to (in
// its directory "straight"; made once).
const TempRun& shared_run() {
  static const TempRun run("cluster_faults");
  static const bool made = [] {
    const Launch l = run_command(mpirun_one_host(2, run.train(kSets + " --set run.out_dir=" + (run.dir / "straight").string())), 120);
    INFO(l.output);
    REQUIRE(l.exit_code == 0);
    return true;
  }();
  (void)made;
  return run;
}

// A case's run directory.
fs::path out_dir(const std::string& name) { return shared_run().dir / name; }
std::string train(const std::string& name, const std::string& sets = "") {
  return shared_run().train(kSets + " --set run.out_dir=" + out_dir(name).string() + " " + sets);
}

// The case's metrics equal the uninterrupted run's, bit for bit.
void check_same_run(const std::string& name) {
  const auto want = metrics(out_dir("straight") / "metrics.jsonl");
  const auto got = metrics(out_dir(name) / "metrics.jsonl");
  REQUIRE(got.size() == want.size());
  for (const auto& [step, lg] : want) {
    INFO("step " << step);
    CHECK(got.at(step).first == lg.first);  // bit for bit
    CHECK(got.at(step).second == lg.second);
  }
}

// A launch whose output the test reads line by line as it comes, noting when lines arrive.
struct Streamed {
  FILE* p = nullptr;
  std::string output;
  int steps = 0;  // step lines seen
  explicit Streamed(const std::string& cmd) : p(popen(("timeout -k 5 60 " + cmd + " 2>&1").c_str(), "r")) {
    REQUIRE(p != nullptr);
  }
  // Reads until a line containing `what`, or until the `steps`-th step line: true; the end: false.
  bool until(const std::string& what, int until_steps = -1) {
    char line[4096];
    while (std::fgets(line, sizeof line, p)) {
      output += line;
      if (std::string(line).rfind("step ", 0) == 0 && ++steps == until_steps) return true;
      if (!what.empty() && std::string(line).find(what) != std::string::npos) return true;
    }
    return false;
  }
  int finish() {  // the exit code, once the output has been read to its end
    until("\x01never");
    const int status = pclose(p);
    p = nullptr;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Streamed() {
    if (p) pclose(p);
  }
};

// The step `latest` names in a checkpoint directory (0: none).
int latest_step(const fs::path& dir) {
  std::ifstream in(dir / "latest");
  std::string name;
  in >> name;
  return name.empty() ? 0 : std::stoi(name.substr(name.find('_') + 1));
}

// Every committed checkpoint (step_N up to `latest`) reads back whole: sizes and checksums.
std::set<int> verify_committed(const fs::path& dir) {
  std::set<int> steps;
  for (int step : pt::ckpt::scan_checkpoint_dir(dir.string()).committed) {
    pt::ckpt::CheckpointReader r((dir / pt::ckpt::step_dir_name(step)).string());
    for (const auto& t : r.manifest().tensors) {
      std::vector<float> v(t.numel());
      r.read_all(t.name, t.numel(), v.data());
    }
    steps.insert(step);
  }
  return steps;
}

uintmax_t bytes_under(const fs::path& dir) {
  uintmax_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

// The pids of this run's picotrain ranks on `host` (those in its network namespace).
std::vector<pid_t> ranks_on(const Cluster& cluster, int host, const std::string& marker) {
  const Launch l = run_command("ip netns pids " + cluster.host_name(host), 10);
  std::set<pid_t> inside;
  std::istringstream in(l.output);
  for (pid_t pid; in >> pid;) inside.insert(pid);
  std::vector<pid_t> out;
  for (pid_t pid : picotrain_ranks(marker))
    if (inside.count(pid)) out.push_back(pid);
  return out;
}

// Waits (at most 30 s) for a save to begin in checkpoint directory `ckpt`: rank 0 has created
// its temporary directory, which is returned (empty on a timeout). Polled every 100 us: a save
// is tens of milliseconds.
fs::path wait_for_save(const fs::path& ckpt) {
  for (const auto t0 = Clock::now(); since(t0) < 30; usleep(100)) {
    std::error_code ec;  // entries come and go as the run saves and prunes
    for (const auto& e : fs::directory_iterator(ckpt, ec))
      if (e.path().filename().string().rfind(".tmp_step_", 0) == 0) return e.path();
  }
  return {};
}

}  // namespace

TEST_CASE("a host whose link goes down mid-run: the watchdog names it, the restarted run resumes bit-exact",
          "[cluster]") {
  const Cluster cluster = Cluster::from_env();
  const fs::path ckpt = out_dir("link") / "checkpoints";

  // Checkpoints at steps 6 and 12: the link goes down after step 7, so in step 8 or soon after
  // (steps take tens of milliseconds, taking a link down a few), not in a save (the next case).
  const std::string every6 = "--set checkpoint.every_steps=6";
  Streamed job(cluster.mpirun(1, train("link", every6)));
  REQUIRE(job.until("", 7));
  const auto down_at = Clock::now();
  cluster.link(1, false);
  const bool named = job.until("no progress for");
  const double detect_s = since(down_at);
  const int code = job.finish();
  const double end_s = since(down_at);
  cluster.link(1, true);
  INFO(job.output);
  REQUIRE(named);
  CHECK(code != 0);
  CHECK(code != 124);  // it ended by itself
  // Rank 0 says whom it waits for: rank 1, on the host that went away.
  CHECK_THAT(job.output, Contains("this rank has waited") && Contains("1 (host " + cluster.host_name(1) + ")"));
  // Within the limit it states (2 s, or 4x the slowest step), plus the watchdog's polling.
  const size_t at = job.output.find("the limit is ");
  REQUIRE(at != std::string::npos);
  const double limit_s = std::stod(job.output.substr(at + 13));
  CHECK(detect_s <= limit_s + 1.5);

  const int logged = static_cast<int>(metrics(out_dir("link") / "metrics.jsonl").size());
  const int committed = latest_step(ckpt);
  REQUIRE(committed == 6);
  const uintmax_t ckpt_bytes = bytes_under(ckpt / pt::ckpt::step_dir_name(committed));
  const auto resume_at = Clock::now();
  Streamed again(cluster.mpirun(1, train("link", every6 + " --set checkpoint.resume=auto")));
  REQUIRE(again.until("", 1));
  const double first_step_s = since(resume_at);
  const int code2 = again.finish();
  const double rerun_s = since(resume_at);
  INFO(again.output);
  REQUIRE(code2 == 0);
  CHECK_THAT(again.output, Contains(pt::ckpt::step_dir_name(committed)));
  check_same_run("link");
  const int redone = logged - committed;  // steps logged after the checkpoint: done again
  std::printf("figure | link down: rank 0's watchdog fired after %.1f s (limit %.1f s), mpirun ended after %.1f s; "
              "restart to first step %.1f s, whole rerun %.1f s; resumed from step %d: %d logged step(s) "
              "(%d tokens, %d bytes of token data) done again, %ju checkpoint bytes read\n",
              detect_s, limit_s, end_s, first_step_s, rerun_s, committed, redone, redone * 64, redone * 128, ckpt_bytes);
}

TEST_CASE("a host whose link goes down during a save: the save's own limit ends the run; resume is bit-exact",
          "[cluster]") {
  const Cluster cluster = Cluster::from_env();
  const fs::path ckpt = out_dir("save_link") / "checkpoints";
  // The save's limit is checkpoint.save_timeout_s (2 s here), not the step's. The test waits for
  // a save to begin, freezes rank 0 in it (SIGSTOP: it has created the temporary directory, and
  // every later part of the save needs rank 1), takes host 1's link down and lets rank 0 go on:
  // it waits for rank 1 in one of the save's agreements until its watchdog ends it.
  Streamed job(cluster.mpirun(1, train("save_link", "--set checkpoint.save_timeout_s=2")));
  REQUIRE(job.until("", 3));  // step 2 is committed
  const std::vector<pid_t> rank0 = ranks_on(cluster, 0, shared_run().dir.string());
  REQUIRE(rank0.size() == 1);
  const fs::path tmp = wait_for_save(ckpt);
  REQUIRE(!tmp.empty());
  REQUIRE(kill(rank0[0], SIGSTOP) == 0);
  const int latest_before = latest_step(ckpt);
  cluster.link(1, false);
  const auto down_at = Clock::now();
  REQUIRE(kill(rank0[0], SIGCONT) == 0);
  const bool named = job.until("no progress for");
  const double detect_s = since(down_at);
  const int code = job.finish();
  cluster.link(1, true);
  INFO(job.output);
  REQUIRE(named);
  CHECK(code != 0);
  CHECK(code != 124);  // it ended by itself
  // Frozen too late (a busy machine can be slower than a save), rank 0 had finished the save and
  // waits in the next step, which its step limit ends; otherwise the save's limit names the save.
  const bool save_done = latest_step(ckpt) > latest_before;
  if (!save_done)
    CHECK_THAT(job.output, Contains("the save of the checkpoint of step") &&
                               Contains("the limit is 2.0 s: checkpoint.save_timeout_s"));
  CHECK_THAT(job.output, Contains("this rank has waited") && Contains("1 (host " + cluster.host_name(1) + ")"));
  CHECK(detect_s <= 2.0 + 1.5);  // the limit, plus the watchdog's polling

  const int committed = latest_step(ckpt);
  Streamed again(cluster.mpirun(1, train("save_link", "--set checkpoint.resume=auto")));
  const int code2 = again.finish();
  INFO(again.output);
  REQUIRE(code2 == 0);
  CHECK_THAT(again.output, Contains("resumed at step " + std::to_string(committed)));
  check_same_run("save_link");
  std::printf("figure | link down during the save of %s: rank 0's watchdog fired after %.1f s (%s); resumed "
              "from step %d\n",
              tmp.filename().c_str(), detect_s,
              save_done ? "the save had finished: the step's limit" : "the save's limit, checkpoint.save_timeout_s",
              committed);
}

TEST_CASE("a rank SIGKILLed while a checkpoint is written loses no committed checkpoint; resume is bit-exact",
          "[cluster]") {
  const Cluster cluster = Cluster::from_env();
  const fs::path ckpt = out_dir("kill") / "checkpoints";
  // A save is tens of milliseconds: rank 0 creates its temporary directory, the ranks write
  // their files and agree twice over the network, then rank 0 commits. The test polls for the
  // temporary directory, freezes rank 0 (SIGSTOP: the commit cannot happen while the test
  // looks), waits a moment for rank 1's files to appear there, kills rank 1 and lets rank 0 go
  // on, to find rank 1 gone. The save must never be committed, and nothing committed lost.
  Streamed job(cluster.mpirun(1, train("kill")));
  REQUIRE(job.until("", 3));  // step 2 is committed
  const std::string marker = shared_run().dir.string();
  const std::vector<pid_t> rank0 = ranks_on(cluster, 0, marker), rank1 = ranks_on(cluster, 1, marker);
  REQUIRE(rank0.size() == 1);
  REQUIRE(rank1.size() == 1);
  const fs::path tmp = wait_for_save(ckpt);
  REQUIRE(!tmp.empty());
  REQUIRE(kill(rank0[0], SIGSTOP) == 0);
  // Rank 1 writes its files unless rank 0 was frozen before it told rank 1 where.
  bool rank1_wrote = false;
  for (const auto t0 = Clock::now(); !rank1_wrote && since(t0) < 1; usleep(1000)) {
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(tmp, ec))
      if (f.path().filename().string().find("_r00001.bin") != std::string::npos) rank1_wrote = true;
  }
  // While rank 0 is frozen nothing is committed: what is committed now was committed before.
  const int latest_before = latest_step(ckpt);
  REQUIRE(latest_before >= 2);
  REQUIRE(kill(rank1[0], SIGKILL) == 0);
  REQUIRE(kill(rank0[0], SIGCONT) == 0);
  const int code = job.finish();
  INFO(job.output);
  CHECK(code != 0);
  CHECK(code != 124);
  // The newest checkpoint committed before the kill is still there, and every committed
  // checkpoint reads back whole (sizes, checksums). The interrupted save is committed only if
  // rank 0 was frozen too late to stop it, with rank 1's part already complete: on a busy
  // machine the test can be slower than a save; then it is whole, which is checked the same way.
  const std::set<int> after = verify_committed(ckpt);
  CHECK(after.count(latest_before) == 1);
  const int latest_after = latest_step(ckpt);
  CHECK((latest_after == latest_before || latest_after == latest_before + 2));

  Streamed again(cluster.mpirun(1, train("kill", "--set checkpoint.resume=auto")));
  const int code2 = again.finish();
  INFO(again.output);
  REQUIRE(code2 == 0);
  CHECK_THAT(again.output, Contains("resumed at step " + std::to_string(latest_after)));
  check_same_run("kill");
  std::printf("figure | SIGKILL of rank 1 during the save of %s (%s): %s; resumed from step %d\n",
              tmp.filename().c_str(), rank1_wrote ? "its files begun" : "before it wrote",
              latest_after == latest_before ? "never committed" : "complete already, committed whole", latest_after);
}

TEST_CASE("a full checkpoint disk fails the save with the path; the earlier checkpoints stay intact", "[cluster]") {
  const Cluster cluster = Cluster::from_env();
  // Room for two checkpoints and a half: the third save (step 6) runs out of space.
  const uintmax_t one = bytes_under(out_dir("straight") / "checkpoints" / pt::ckpt::step_dir_name(kSteps));
  const uintmax_t disk_kib = one * 5 / 2 / 1024;
  const fs::path mount = out_dir("small_disk"), kept = out_dir("kept");
  fs::create_directories(mount);
  // The tmpfs lives in a mount namespace of the job's own (unshare -m), which every rank's
  // `ip netns exec` copies: it vanishes with the job. Its checkpoints are copied out to be checked.
  const fs::path on_small_disk = out_dir("on_small_disk.sh");
  std::ofstream(on_small_disk) << "# on_small_disk.sh KIB MOUNT KEPT COMMAND...: COMMAND with a tmpfs of KIB KiB at MOUNT,\n"
                                  "# then MOUNT/ckpt copied to KEPT; COMMAND's exit code.\n"
                                  "mount -t tmpfs -o size=\"$1\"k picotrain-test \"$2\" || exit 1\n"
                                  "mount=$2 kept=$3; shift 3\n"
                                  "\"$@\"; code=$?\n"
                                  "cp -a \"$mount/ckpt\" \"$kept\"\n"
                                  "exit $code\n";
  const std::string wrap = "unshare -m --propagation private sh " + on_small_disk.string() + " " +
                           std::to_string(disk_kib) + " " + mount.string() + " " + kept.string() + " %s";
  Streamed job(cluster.mpirun(1, train("disk", "--set checkpoint.dir=" + (mount / "ckpt").string()), 2, wrap));
  const int code = job.finish();
  INFO(job.output);
  CHECK(code == 1);
  CHECK_THAT(job.output, Contains((mount / "ckpt").string()) && Contains("No space left on device"));
  CHECK(latest_step(kept) == 4);
  CHECK(verify_committed(kept) == std::set<int>{2, 4});
  for (const auto& e : fs::directory_iterator(kept)) CHECK(e.path().filename().string().rfind(".tmp_", 0) != 0);
  // And they are good to resume from, on a disk with room.
  Streamed again(cluster.mpirun(1, train("disk", "--set checkpoint.dir=" + kept.string() + " --set checkpoint.resume=auto")));
  const int code2 = again.finish();
  INFO(again.output);
  REQUIRE(code2 == 0);
  check_same_run("disk");
  const size_t at = job.output.find("error: ");
  std::printf("figure | full disk (%ju KiB tmpfs, checkpoints of %ju bytes): %s", disk_kib, one,
              at == std::string::npos ? "\n" : job.output.substr(at, job.output.find('\n', at) - at + 1).c_str());
}

TEST_CASE("a slow host slows the run and changes none of its numbers", "[cluster]") {
  const Cluster cluster = Cluster::from_env();
  // Host 1 sends at most 20 Mbit/s. Each ZeRO-1 step it sends at least one copy of the model's
  // size (rank 0's half of the gradients for the reduce-scatter, its own half of the parameters
  // for the all-gather), so no step can be faster than 4 bytes x parameters / 20 Mbit/s, less
  // the 16 KB the token bucket may send at once.
  constexpr int mbit = 20;
  cluster.slow(1, mbit);
  const auto t0 = Clock::now();
  Streamed job(cluster.mpirun(1, train("slow")));
  const int code = job.finish();
  const double slow_s = since(t0);
  cluster.slow(1, 0);
  INFO(job.output);
  REQUIRE(code == 0);
  check_same_run("slow");
  const auto report = nlohmann::json::parse(std::ifstream(out_dir("slow") / "report.json"));
  const double params = report["run"]["params"].get<double>();
  const double floor_ms = (4 * params - 16 * 1024) / (mbit * 1e6 / 8) * 1e3;
  auto step_ms = [](const fs::path& file) {
    std::vector<double> ms;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) ms.push_back(nlohmann::json::parse(line)["dt_ms"].get<double>());
    return ms;
  };
  double slow_ms = 0, one_host_ms = 0;
  for (double dt : step_ms(out_dir("slow") / "metrics.jsonl")) {
    CHECK(dt >= floor_ms);
    slow_ms += dt / kSteps;
  }
  for (double dt : step_ms(out_dir("straight") / "metrics.jsonl")) one_host_ms += dt / kSteps;
  std::printf("figure | slow host (%d Mbit/s out of host 1, %.0f parameters): %.0f ms per step (floor %.0f) vs %.0f "
              "on one host, whole run %.1f s, losses bit-identical\n",
              mbit, params, slow_ms, floor_ms, one_host_ms, slow_s);
}
