// The picotrain binary under mpirun (this test itself runs as one plain process and launches
// mpirun; see test/CMakeLists.txt): bad layouts are config errors printed by every rank, with
// the numbers, and exit 2 without hanging (each launch runs under `timeout`); a good multi-rank
// run logs and writes its run directory from rank 0 only, and a finished one (ZeRO-3, pipeline)
// its final checkpoint from every rank; a checkpoint saved under one layout
// resumes under another on the same trajectory; a rank that stops responding ends the run
// through the other's watchdog instead of hanging it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <map>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/ckpt/checkpoint_reader.h"
#include "relative_error.h"
#include "launch_test_support.h"
#include "run_test_support.h"

using Catch::Matchers::Contains;
using pt::test::Launch;
using pt::test::metrics;
using pt::test::picotrain_ranks;
using pt::test::TempRun;
using pt::test::relative_l2;
using pt::test::run_command;
namespace fs = std::filesystem;

namespace {

// `timeout` turns a hang into exit code 124 instead of a stuck test.
Launch mpirun(int ranks, const std::string& args) {
  const std::string cmd = std::string(PICOTRAIN_MPIEXEC) + " -np " + std::to_string(ranks) + " " +
                          PICOTRAIN_MPIEXEC_FLAGS + " " + PICOTRAIN_BIN + " " + args;
  const Launch l = run_command(cmd, 60);
  INFO(cmd << "\n" << l.output);
  CHECK(l.exit_code != 124);  // no hang
  return l;
}

// Every tensor of one state ("master/...") of a checkpoint, concatenated in name order (the
// manifest's order depends on which rank wrote what).
std::vector<float> checkpoint_state(const fs::path& step_dir, const std::string& state) {
  pt::ckpt::CheckpointReader r(step_dir.string());
  std::map<std::string, std::vector<float>> by_name;
  for (const auto& t : r.manifest().tensors) {
    if (t.name.rfind(state + "/", 0) != 0) continue;
    std::vector<float>& v = by_name[t.name];
    v.resize(t.numel());
    r.read_all(t.name, t.numel(), v.data());
  }
  std::vector<float> out;
  for (const auto& [name, v] : by_name) out.insert(out.end(), v.begin(), v.end());
  return out;
}

// A finished run's final checkpoint (no checkpoint settings: the end is saved collectively by
// every rank): committed, named by the done line, and holding the whole model, every pipeline
// stage's and ZeRO shard's part of it.
void check_final_checkpoint(const TempRun& run, const Launch& l, const std::string& step_dir) {
  const fs::path dir = run.dir / "run" / "checkpoints" / step_dir;
  CHECK_THAT(l.output, Contains("; final checkpoint " + dir.string() + "\n"));
  std::ifstream latest(run.dir / "run" / "checkpoints" / "latest");
  std::string name;
  std::getline(latest, name);
  CHECK(name == step_dir);
  const pt::ckpt::CheckpointReader r(dir.string());
  for (const char* t : {"master/wte", "master/h.0.ln_1.weight", "master/h.1.mlp.c_fc.weight", "adam_m/ln_f.weight",
                        "adam_v/wpe"})
    CHECK(r.has(t));
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
  return n;
}

}  // namespace

TEST_CASE("bad layouts fail on every rank with the numbers, without hanging", "[mpi]") {
  const TempRun run;
  struct Case {
    int ranks;
    std::string sets, message;
  };
  const std::vector<Case> cases = {
      {3, "--set parallel.dp_replicate=2", "parallel.dp_replicate=2 must divide parallel.dp=3"},
      {3, "--set parallel.tp=2", "the world size 3 is not divisible by parallel.tp*pp*cp = 2*1*1 = 2"},
      {2, "--set parallel.dp=4", "parallel.dp*tp*pp*cp = 4*1*1*1 = 4 must equal the world size 2"},
      {2, "--set parallel.cp=2 --set batch.seq_len=18", "batch.seq_len=18 must be divisible by 2*parallel.cp=4"},
  };
  for (const auto& c : cases) {
    const Launch l = mpirun(c.ranks, run.train(c.sets));
    INFO(c.sets << " on " << c.ranks << " ranks:\n" << l.output);
    CHECK(l.exit_code == 2);
    for (int r = 0; r < c.ranks; r++) {
      // Each rank's one line: "error: rank R: <message naming the numbers>".
      const std::string prefix = "error: rank " + std::to_string(r) + ": ";
      const size_t at = l.output.find(prefix);
      REQUIRE(at != std::string::npos);
      CHECK_THAT(l.output.substr(at, l.output.find('\n', at) - at), Contains(c.message));
    }
  }
}

TEST_CASE("a multi-rank run logs and writes its run directory from rank 0 only", "[mpi]") {
  const TempRun run;
  const Launch l = mpirun(2, run.train("--set parallel.zero_stage=3"));
  INFO(l.output);
  CHECK(l.exit_code == 0);
  CHECK(count(l.output, "/3 | loss") == 3);  // three step lines, not six
  CHECK(count(l.output, "memory    |") == 2);  // the plan, and what rank 0 holds after step 1
  CHECK(count(l.output, "memory    | step 1 on rank 0: allocated ") == 1);
  CHECK_THAT(l.output, Contains("dp x cp groups: [0 1]"));
  std::ifstream metrics(run.dir / "run" / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) lines++;
  CHECK(lines == 3);
  CHECK(fs::exists(run.dir / "run" / "config.json"));
  check_final_checkpoint(run, l, "step_00000003");
}

TEST_CASE("a pipeline run warns about its bubble and logs the measured bubble and waits", "[mpi][pipeline]") {
  const TempRun run;
  // 2 micro-batches over 2 stages: the bubble (pp-1)/m is 50% of compute time.
  const Launch l = mpirun(2, run.train("--set parallel.pp=2 --set batch.global_batch_tokens=64 "
                                       "--set recompute.mode=full"));
  INFO(l.output);
  REQUIRE(l.exit_code == 0);
  CHECK(count(l.output, "warning: pipeline bubble 50.0% ((pp-1)/m with pp=2, m=2") == 1);
  CHECK(count(l.output, "stage 0   | embeddings + layer 0, 2 micro-batch(es) in flight") == 1);
  CHECK(count(l.output, "stage 1   | layer 1 + head, 1 micro-batch(es) in flight") == 1);
  CHECK(count(l.output, "recompute full") == 2);  // one memory line per stage
  CHECK(count(l.output, "% wait ") == 3);        // every step line
  std::ifstream metrics(run.dir / "run" / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line); lines++) {
    const auto j = nlohmann::json::parse(line);
    CHECK(j["pp_bubble"].get<double>() >= 0.0);
    CHECK(j["pp_bubble"].get<double>() < 1.0);
    CHECK(j["pp_wait_ms"].get<double>() >= 0.0);
    CHECK(std::isfinite(j["loss"].get<double>()));
    // The device phases, pipeline send/recv among them, are parts of the step.
    double inside = 0;
    for (const char* phase : {"forward_ms", "backward_ms", "pp_comm_ms", "grad_sync_ms", "optimizer_ms"}) {
      INFO(phase);
      CHECK(j.at(phase).get<double>() >= 0.0);
      inside += j.at(phase).get<double>();
    }
    CHECK(inside <= j["dt_ms"].get<double>());
  }
  CHECK(lines == 3);
  check_final_checkpoint(run, l, "step_00000003");
}

TEST_CASE("tp2 x cp2 with sequence parallel runs from the command line and samples from the gathered model",
          "[mpi][tp][cp]") {
  const TempRun run;
  const Launch l = mpirun(4, run.train("--set parallel.tp=2 --set parallel.cp=2 --set parallel.sequence_parallel=true "
                                       "--set checkpoint.every_steps=2 --set logging.sample_every=3 "
                                       "--set logging.sample_tokens=8"));
  INFO(l.output);
  REQUIRE(l.exit_code == 0);
  CHECK_THAT(l.output, Contains("world 4 = dp 1 x tp 2 x pp 1 x cp 2"));
  CHECK(count(l.output, "/3 | loss") == 3);
  CHECK(count(l.output, "step 3, ") == 1);  // the sample, from the weights gathered over tp
  // The checkpoint holds whole tensors, those of a one-rank run of the same steps.
  const std::vector<float> master = checkpoint_state(run.dir / "run" / "checkpoints" / "step_00000003", "master");
  const Launch one = mpirun(1, run.train("--set checkpoint.every_steps=2 --set run.out_dir=" +
                                         (run.dir / "one").string()));
  REQUIRE(one.exit_code == 0);
  const std::vector<float> want = checkpoint_state(run.dir / "one" / "checkpoints" / "step_00000003", "master");
  REQUIRE(master.size() == want.size());
  CHECK(relative_l2(master, want) < 1e-5);
}

TEST_CASE("a checkpoint saved under dp=4/ZeRO-1 resumes under dp=2/ZeRO-3 and dp=1 on the same trajectory",
          "[mpi][ckpt]") {
  const TempRun run;
  const std::string common = "--set schedule.total_steps=10 --set checkpoint.every_steps=5 "
                             "--set batch.global_batch_tokens=256 --set optim.lr=3e-3";
  auto out_dir = [&](const std::string& name) { return run.dir / name; };
  auto train = [&](int ranks, const std::string& name, const std::string& sets) {
    const Launch l = mpirun(ranks, run.train(common + " --set run.out_dir=" + out_dir(name).string() + " " + sets));
    INFO(name << ":\n" << l.output);
    REQUIRE(l.exit_code == 0);
  };
  train(1, "straight", "");
  train(4, "dp4_zero1", "--set parallel.zero_stage=1");
  const std::string step5 = (out_dir("dp4_zero1") / "checkpoints" / "step_00000005").string();
  train(2, "dp2_zero3", "--set parallel.zero_stage=3 --set checkpoint.resume=" + step5);
  train(1, "dp1", "--set checkpoint.resume=" + step5);

  const auto want = metrics(out_dir("straight") / "metrics.jsonl");
  const std::vector<float> want_master = checkpoint_state(out_dir("straight") / "checkpoints" / "step_00000010", "master");
  for (const std::string name : {"dp4_zero1", "dp2_zero3", "dp1"}) {
    INFO(name);
    const auto got = metrics(out_dir(name) / "metrics.jsonl");
    CHECK(got.size() == (name == "dp4_zero1" ? 10u : 5u));  // resumed runs log steps 6..10
    for (const auto& [step, lg] : got) {
      INFO("step " << step);
      CHECK(lg.first == Approx(want.at(step).first).epsilon(1e-5));
      CHECK(lg.second == Approx(want.at(step).second).epsilon(1e-5));
    }
    const std::vector<float> master = checkpoint_state(out_dir(name) / "checkpoints" / "step_00000010", "master");
    REQUIRE(master.size() == want_master.size());
    CHECK(relative_l2(master, want_master) < 1e-5);
  }
}

TEST_CASE("a rank that stops responding ends the run after run.hang_timeout_s instead of hanging it", "[mpi]") {
  // Two ranks train a run far too long to finish; once three steps are logged one rank is
  // stopped (SIGSTOP: as a rank stuck in a driver call, it neither fails nor answers). The
  // other waits for it in a collective until its watchdog ends it (exit code 1, the reason on
  // stderr), and mpirun then ends the stopped one. `timeout` would give 124 if it hung.
  const TempRun run;
  const std::string config = (run.dir / "c.json").string();
  const std::string cmd = "timeout 120 " + std::string(PICOTRAIN_MPIEXEC) + " -np 2 " + PICOTRAIN_MPIEXEC_FLAGS + " " +
                          PICOTRAIN_BIN + " " +
                          run.train("--set schedule.total_steps=1000000 --set run.hang_timeout_s=2 "
                                    "--set logging.every_steps=1 --set checkpoint.every_steps=0") +
                          " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  int steps = 0;
  std::string output = pt::test::read_until_step_lines(p, 3, &steps);
  INFO(output);
  REQUIRE(steps == 3);
  const std::vector<pid_t> ranks = picotrain_ranks(config);
  REQUIRE(ranks.size() == 2);
  const auto stopped_at = std::chrono::steady_clock::now();
  REQUIRE(kill(ranks[1], SIGSTOP) == 0);
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) output.append(buf, n);
  const int status = pclose(p);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  for (pid_t pid : picotrain_ranks(config)) kill(pid, SIGKILL);  // nothing may outlive the test
  INFO(output);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  CHECK(code != 0);
  CHECK(code != 124);  // it ended by itself
  CHECK(seconds >= 2.0);
  CHECK_THAT(output, Contains("no progress for") && Contains("has not finished") &&
                         Contains("run.hang_timeout_s") && Contains("Ending this rank (exit code 1)"));
  CHECK_THAT(output, Contains("watchdog  | a rank without progress for 2 s") &&
                         Contains("a checkpoint save after 900 s (checkpoint.save_timeout_s)"));
}
