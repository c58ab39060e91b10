// The run report: complete and consistent with metrics.jsonl for a short CPU run, for a run
// stopped by SIGTERM and resumed, and for a run that crashed (SIGKILL) and was resumed; and its
// pieces: communication timing, the step timeline's device phases, stalls, the session totals,
// plots without gnuplot.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "ckpt_test_support.h"
#include "core/cpu/cpu_ops.h"
#include "core/dist/timed_comm.h"
#include "core/metrics/peak_probe.h"
#include "core/metrics/step_timeline.h"
#include "core/report/report_plots.h"
#include "core/report/run_report.h"
#include "core/train/work_progress.h"
#include "core/report/session_log.h"
#include "run_test_support.h"

using namespace pt;
using namespace pt::test;
using nlohmann::json;
using Catch::Matchers::Contains;

namespace {

// A group of two that does nothing: what TimedComm counts, not what a collective does.
class NullComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::vector<int>& members() const override { return members_; }
  void all_reduce(Tensor) override {}
  void all_reduce(double*, size_t) override {}
  void reduce_scatter(Tensor, Tensor) override {}
  void all_gather(Tensor, Tensor) override {}
  void all_to_all(Tensor, Tensor) override {}
  void broadcast(Tensor, int) override {}
  void send(Tensor, int) override {}
  void recv(Tensor, int) override {}
  void barrier() override {}

 private:
  std::vector<int> members_ = {0, 1};
};

}  // namespace

TEST_CASE("TimedComm counts calls and bytes per kind; p2p is not a collective", "[report]") {
  auto stats = std::make_shared<CommStats>();
  TimedComm c(std::make_unique<NullComm>(), stats);
  float buf[8] = {};
  double d[3] = {};
  c.all_reduce(Tensor{buf, 8, DType::f32});
  c.all_reduce(d, 3);
  c.reduce_scatter(Tensor{buf, 8, DType::f32}, Tensor{buf, 4, DType::f32});
  c.all_gather(Tensor{buf, 4, DType::f32}, Tensor{buf, 8, DType::f32});
  c.send(Tensor{buf, 2, DType::f32}, 1);
  c.recv(Tensor{buf, 2, DType::f32}, 1);
  const auto at = [](CommKind k) { return static_cast<size_t>(k); };
  CHECK(stats->calls[at(CommKind::all_reduce)] == 2);
  CHECK(stats->bytes[at(CommKind::all_reduce)] == 32 + 24);
  CHECK(stats->bytes[at(CommKind::reduce_scatter)] == 32);  // the full input
  CHECK(stats->bytes[at(CommKind::all_gather)] == 32);      // the gathered output
  CHECK(stats->calls[at(CommKind::p2p)] == 2);
  CHECK(stats->bytes[at(CommKind::p2p)] == 16);
  CHECK(stats->collective_bytes() == 32 + 24 + 32 + 32);
  CHECK(stats->collective_seconds() <= stats->seconds[at(CommKind::all_reduce)] + stats->seconds[at(CommKind::reduce_scatter)] +
                                           stats->seconds[at(CommKind::all_gather)] + 1e-12);
}

TEST_CASE("the step timeline gives each phase the time from its mark to the next", "[report]") {
  CpuOps ops;
  StepTimeline tl(ops);
  const auto sleep_ms = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  tl.enter(StepPhase::optimizer);  // before start: ignored
  const auto t0 = std::chrono::steady_clock::now();
  tl.start(StepPhase::forward);
  sleep_ms(30);
  tl.enter(StepPhase::backward);
  sleep_ms(10);
  tl.enter(StepPhase::backward);  // already there: no mark, the time stays backward's
  sleep_ms(10);
  tl.enter(StepPhase::forward);  // a phase entered twice adds up
  sleep_ms(15);
  tl.enter(StepPhase::optimizer);
  const PhaseTimes t = tl.finish();
  const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(t[StepPhase::forward] >= 45.0);
  CHECK(t[StepPhase::backward] >= 20.0);
  CHECK(t[StepPhase::backward] < t[StepPhase::forward]);
  CHECK(t[StepPhase::optimizer] >= 0.0);
  CHECK(t[StepPhase::optimizer] < 10.0);
  CHECK(t[StepPhase::pp_comm] == 0.0);
  CHECK(t[StepPhase::grad_sync] == 0.0);
  CHECK(t.total_ms() <= wall);
  CHECK(t.total_ms() >= 65.0);
  // After finish the timeline is idle again: enter is ignored, finish gives nothing.
  tl.enter(StepPhase::backward);
  CHECK(tl.finish().total_ms() == 0.0);
  const std::string line = describe_phases(t, 100.0, 2.5);
  CHECK_THAT(line, Contains("forward "));
  CHECK_THAT(line, Contains("backward "));
  CHECK_THAT(line, !Contains("pp_comm"));
  CHECK_THAT(line, Contains("data 2.5 ms"));
}

TEST_CASE("the CPU's MFU peak probe measures a 512^3 matmul rate", "[report]") {
  CpuOps ops;
  const PeakProbe probe = measure_matmul_peak(ops);
  CHECK(probe.size == 512);
  REQUIRE(std::isfinite(probe.tflops));
  CHECK(probe.tflops > 0.0);
  CHECK(ops.memory_use().live == 0);  // its matrices are released
}

TEST_CASE("stalls are steps slower than 3x the median; the first step never is one", "[report]") {
  double median = 0;
  const std::vector<Stall> steps = {{1, 900}, {2, 10}, {3, 11}, {4, 9}, {5, 45}, {6, 10}};
  const std::vector<Stall> stalls = find_stalls(steps, 3.0, &median);
  CHECK(median == 10);
  REQUIRE(stalls.size() == 1);
  CHECK(stalls[0].step == 5);
  CHECK(find_stalls({{1, 5}, {2, 100}}, 3.0, &median).empty());  // too few to tell
}

TEST_CASE("session totals: restarts, crashed sessions, time summed over the ended sessions", "[report]") {
  const json end1 = {{"event", "end"}, {"time", {{"steps_s", 2.0}, {"wall_s", 3.0}, {"steps", 5}, {"checkpoints", 1}}},
                     {"comm", {{"all_reduce", {{"seconds", 0.5}, {"bytes", 100.0}, {"calls", 7}}}}},
                     {"stalls", {{{"step", 4}, {"ms", 80.0}}}}};
  const json end2 = {{"event", "end"}, {"time", {{"steps_s", 1.0}, {"wall_s", 1.5}, {"steps", 2}, {"checkpoints", 2}}}};
  const json start = {{"event", "start"}};
  const SessionTotals t = sum_sessions({start, end1, start, start, end2});  // the second session crashed
  CHECK(t.sessions == 3);
  CHECK(t.restarts == 2);
  CHECK(t.crashed == 1);
  CHECK(t.time.steps == 3.0);
  CHECK(t.time.wall == 4.5);
  CHECK(t.time.step_count == 7);
  CHECK(t.time.checkpoints == 3);
  CHECK(t.comm.calls[static_cast<size_t>(CommKind::all_reduce)] == 7);
  REQUIRE(t.stalls.size() == 1);
  CHECK(t.stalls[0].step == 4);
  CHECK(sum_sessions({start}).crashed == 1);
}

TEST_CASE("without gnuplot there are no plots and a note says why", "[report]") {
  const fs::path dir = fs::temp_directory_path() / ("picotrain_plots_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "loss.png") << "stale";  // an earlier session's plot must not survive
  const std::vector<json> metrics = {{{"step", 1}, {"loss", 5.0}, {"tokens", 64}, {"tokens_per_s", 100.0}}};
  const Plots p = write_plots(dir.string(), metrics, "/nonexistent/gnuplot");
  CHECK(p.files.empty());
  CHECK_THAT(p.note, Contains("not found"));
  CHECK_FALSE(fs::exists(dir / "loss.png"));
  fs::remove_all(dir);
}

namespace {

// Every field the report promises (docs/log.md, "The run report").
const std::vector<std::string> kFields = {
    "/run/name", "/run/status", "/run/step", "/run/total_steps", "/run/tokens", "/run/params",
    "/build/commit", "/build/tree", "/hardware/device", "/hardware/gpus", "/hardware/gpu_model", "/hardware/ranks", "/hardware/nodes",
    "/hardware/interconnect/within_node", "/hardware/interconnect/between_nodes",
    "/layout/dp", "/layout/tp", "/layout/pp", "/layout/cp", "/layout/zero_stage", "/layout/recompute",
    "/layout/memory_per_rank", "/batch/tokens_per_step", "/batch/seq_len", "/batch/micro_batch_size",
    "/batch/grad_accum_steps", "/precision/compute_dtype", "/precision/matmul_algos", "/checkpoint/every_steps", "/checkpoint/writes",
    "/throughput/tokens_per_s", "/throughput/tflops_per_gpu", "/throughput/mfu", "/throughput/mfu_formula",
    "/throughput/flops_per_token", "/throughput/peak_tflops", "/time/wall_s", "/time/steps_s", "/time/compute_s",
    "/time/comm_s", "/time/bubble_s", "/time/data_s", "/time/checkpoint_s", "/time/eval_s", "/time/steps",
    "/reliability/sessions", "/reliability/restarts", "/reliability/crashed_sessions", "/reliability/stalls",
    "/loss/final_train", "/loss/final_val", "/sample/text", "/sample/note", "/plots/files", "/plots/note"};

json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return json::parse(in);
}

double mean_after_step_1(const std::vector<json>& metrics, const char* field) {
  double sum = 0;
  int n = 0;
  for (const json& r : metrics)
    if (r["step"].get<int>() > 1) sum += r[field].get<double>(), n++;
  return sum / n;
}

// The commit git says the sources are at, as cmake/build_info.cmake records it at every build;
// "unknown" without git or outside a checkout.
std::string source_commit() {
  const Launch l = run_command("git -C '" PICOTRAIN_SOURCE_DIR "' rev-parse --short=12 HEAD");
  if (l.exit_code != 0) return "unknown";
  return l.output.substr(0, l.output.find_first_of("\r\n"));
}

// The report of `run_dir` is complete, and its numbers are metrics.jsonl's.
json check_report(const fs::path& run_dir) {
  const json r = read_json(run_dir / "report.json");
  for (const auto& f : kFields) {
    INFO(f);
    CHECK(r.contains(json::json_pointer(f)));
  }
  CHECK(r["build"]["commit"] == source_commit());  // the run names the code it was trained with
  const std::vector<json> metrics = read_metrics((run_dir / "metrics.jsonl").string());
  REQUIRE(metrics.size() >= 2);
  const json& last = metrics.back();
  CHECK(r["run"]["step"] == last["step"]);  // every step is logged in these runs
  CHECK(r["run"]["tokens"] == last["tokens"]);
  CHECK(r["batch"]["tokens_per_step"].get<double>() * last["step"].get<double>() == last["tokens"].get<double>());
  CHECK(r["loss"]["final_train"] == last["loss"]);
  CHECK(r["loss"]["final_train_step"] == last["step"]);
  for (auto it = metrics.rbegin(); it != metrics.rend(); ++it)
    if (it->contains("val_loss")) {
      CHECK(r["loss"]["final_val"] == (*it)["val_loss"]);
      CHECK(r["loss"]["final_val_step"] == (*it)["step"]);
      break;
    }
  CHECK(r["throughput"]["tokens_per_s"].get<double>() == Approx(mean_after_step_1(metrics, "tokens_per_s")));
  CHECK(r["throughput"]["tflops_per_gpu"].get<double>() == Approx(mean_after_step_1(metrics, "tflops_per_gpu")));
  CHECK(r["throughput"]["mfu"].get<double>() == Approx(mean_after_step_1(metrics, "mfu")));
  // The time of the steps is the sum of the steps' dt_ms (and its parts), on one rank.
  const json& t = r["time"];
  CHECK(r["hardware"]["ranks"] == 1);
  CHECK(r["hardware"]["gpus"] == 0);
  CHECK(r["hardware"]["nodes"] == 1);
  CHECK(t["compute_s"].get<double>() + t["comm_s"].get<double>() + t["bubble_s"].get<double>() +
            t["data_s"].get<double>() ==
        Approx(t["steps_s"].get<double>()));
  CHECK(t["wall_s"].get<double>() >= t["steps_s"].get<double>() + t["checkpoint_s"].get<double>());
  const std::string md = read_text((run_dir / "report.md").string());
  for (const char* section : {"## Hardware", "## Layout, batch, precision", "## Throughput", "## Where the time went",
                              "## Stalls and restarts", "## Loss", "## Sample"})
    CHECK_THAT(md, Contains(section));
  CHECK_THAT(md, Contains("MFU = tokens/s x FLOPs per token"));
  // Plots: drawn when gnuplot is here, else a note (never a failed run).
  if (r["plots"]["note"].get<std::string>().empty()) {
    CHECK(r["plots"]["files"].size() == 2);
    for (const auto& f : r["plots"]["files"]) CHECK(fs::file_size(run_dir / f.get<std::string>()) > 0);
  }
  return r;
}

// Sums of dt_ms, data_ms, comm_ms and the device phases over the records (every step is logged).
struct Sums {
  double dt = 0, data = 0, comm = 0;
  std::map<std::string, double> phases;
  int steps = 0;
};
Sums metric_sums(const fs::path& run_dir) {
  Sums s;
  for (const json& r : read_metrics((run_dir / "metrics.jsonl").string())) {
    s.dt += r["dt_ms"].get<double>() / 1e3;
    s.data += r["data_ms"].get<double>() / 1e3;
    s.comm += r["comm_ms"].get<double>() / 1e3;
    // One CPU rank, no pipeline: every phase but pp_comm, each a part of the step.
    double inside = 0;
    for (const char* phase : {"forward", "backward", "grad_sync", "optimizer"}) {
      const double ms = r.at(std::string(phase) + "_ms").get<double>();
      CHECK(ms >= 0.0);
      inside += ms;
      s.phases[phase] += ms / 1e3;
    }
    CHECK(!r.contains("pp_comm_ms"));
    CHECK(r["forward_ms"].get<double>() > 0.0);
    CHECK(r["backward_ms"].get<double>() > 0.0);
    CHECK(r["optimizer_ms"].get<double>() > 0.0);
    CHECK(inside <= r["dt_ms"].get<double>());
    CHECK(inside + r["data_ms"].get<double>() <= r["dt_ms"].get<double>() + 1e-9);
    s.steps++;
  }
  return s;
}

// A tiny run on one CPU rank logging every step, with validation and periodic checkpoints.
std::string write_config(CkptFixture& fx, int total_steps) {
  std::vector<uint16_t> val(3000);
  for (size_t i = 0; i < val.size(); i++) val[i] = static_cast<uint16_t>((i * 7) % 256);
  write_shard((fx.dir / "d_val_000000.bin").string(), val);
  json j = fx.json("run");
  j["schedule"]["total_steps"] = total_steps;
  j["batch"] = {{"micro_batch_size", 4}, {"seq_len", 64}, {"global_batch_tokens", 256}};
  j["data"]["val"] = (fx.dir / "d_val_*.bin").string();
  j["data"]["val_every_steps"] = 5;
  j["data"]["val_tokens"] = 512;
  j["checkpoint"] = {{"every_steps", 4}};
  const std::string cfg = (fx.dir / "cfg.json").string();
  std::ofstream(cfg) << j.dump();
  return cfg;
}

}  // namespace

TEST_CASE("picotrain --version names the commit the sources are at and whether the tree was clean", "[report]") {
  const Launch l = run_command(std::string(PICOTRAIN_BIN) + " --version");
  INFO(l.output);
  CHECK(l.exit_code == 0);
  // A build that recorded nothing (or a stale commit) fails here wherever git knows the commit.
  CHECK(l.output.rfind("picotrain commit " + source_commit() + " (", 0) == 0);
  const bool tree_named = l.output.find("(clean tree)") != std::string::npos ||
                          l.output.find("(modified tree)") != std::string::npos ||
                          l.output.find("(unknown tree)") != std::string::npos;
  CHECK(tree_named);
}

TEST_CASE("a short CPU run writes a complete report that agrees with metrics.jsonl", "[report]") {
  CkptFixture fx("report_run");
  const std::string cfg = write_config(fx, 12);
  const Launch l = run_command(std::string(PICOTRAIN_BIN) + " train --config " + cfg);
  INFO(l.output);
  REQUIRE(l.exit_code == 0);
  CHECK_THAT(l.output, Contains("report    | "));
  const json r = check_report(fx.dir / "run");
  CHECK(r["run"]["status"] == "finished");
  CHECK(r["reliability"]["sessions"] == 1);
  CHECK(r["reliability"]["restarts"] == 0);
  CHECK(r["checkpoint"]["writes"] == 3);  // steps 4, 8, 12 (the last once: periodic and final)
  // The final checkpoint, named by the done line and the report with what to do with it.
  const std::string final_ckpt = fx.step_dir(12);
  CHECK(r["checkpoint"]["final_checkpoint"] == final_ckpt);
  CHECK(r["checkpoint"]["cadence"] == "every 4 steps and at the end");
  CHECK_THAT(l.output, Contains("; final checkpoint " + final_ckpt + "\n"));
  const std::string md = read_text((fx.dir / "run" / "report.md").string());
  CHECK_THAT(md, Contains("## Trained model") && Contains("`" + final_ckpt + "`") &&
                     Contains("`picotrain sample --checkpoint " + final_ckpt + "`") &&
                     Contains("`picotrain convert --from " + final_ckpt + " --to ") && Contains(" --format hf`"));
  const Sums s = metric_sums(fx.dir / "run");
  CHECK(r["time"]["steps"] == s.steps);
  CHECK(r["time"]["steps_s"].get<double>() == Approx(s.dt));
  CHECK(r["time"]["data_s"].get<double>() == Approx(s.data).margin(1e-9));
  CHECK(r["time"]["comm_s"].get<double>() == Approx(s.comm).margin(1e-9));
  for (const auto& [phase, seconds] : s.phases) {
    INFO(phase);
    CHECK(r["time"]["device_phases_s"][phase].get<double>() == Approx(seconds).margin(1e-9));
  }
  CHECK(r["time"]["device_phases_s"]["pp_comm"].get<double>() == 0.0);
  CHECK(l.output.find("phases    | step 2, ") != std::string::npos);
  // Where the process's time went outside the steps: start-up before the first step, each part
  // at the end.
  CHECK(l.output.find("start-up  | ") < l.output.find("step  1/12"));
  CHECK_THAT(l.output, Contains(" since the process started: buffers "));
  CHECK_THAT(l.output, Contains("done      | 12 steps in "));
  CHECK_THAT(l.output, Contains(", validation "));
  // val_every_steps 5: the data line says when validation runs, and on how much.
  CHECK_THAT(l.output, Contains("validating on 512 every 5 steps and after the last"));
  CHECK_THAT(read_text((fx.dir / "run" / "report.md").string()), Contains("Inside the training steps, on the device's clock"));
  // logging.sample_every is 0 (the default): no sample in the log, none in the report.
  CHECK(r["sample"]["text"].get<std::string>().empty());
  CHECK_THAT(r["sample"]["note"].get<std::string>(), Contains("logging.sample_every=0"));
}

TEST_CASE("data.val_every_steps=0 validates never; data.final_val once, after the last step", "[report]") {
  CkptFixture fx("report_final_val");
  const std::string cfg = write_config(fx, 6);
  const auto val_steps = [&] {
    std::vector<int> steps;
    std::ifstream in(fx.dir / "run" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.contains("val_loss")) steps.push_back(j["step"].get<int>());
    }
    return steps;
  };
  const std::string train = std::string(PICOTRAIN_BIN) + " train --config " + cfg +
                            " --set checkpoint.every_steps=0 --set data.val_every_steps=0";
  SECTION("val_every_steps=0: none, and the data line says the split is unused") {
    const Launch l = run_command(train);
    INFO(l.output);
    REQUIRE(l.exit_code == 0);
    CHECK_THAT(l.output, Contains("checkpoint| at the end of the run into "));  // every_steps=0 still saves the end
    CHECK(val_steps().empty());
    CHECK_THAT(l.output, Contains("unused (data.val_every_steps=0 and data.final_val=false)"));
    CHECK(l.output.find("val       | ") == std::string::npos);
  }
  SECTION("final_val: one, after the last step, announced before it starts, on val_tokens") {
    const Launch l = run_command(train + " --set data.final_val=true");
    INFO(l.output);
    REQUIRE(l.exit_code == 0);
    CHECK(val_steps() == std::vector<int>{6});
    CHECK_THAT(l.output, Contains("validating on 512 after the last step (data.final_val)"));
    // 512 tokens of 4 x 64 per batch: 2 batches.
    CHECK_THAT(l.output, Contains("val       | after the last step: 2 batches, 512 tokens (data.val_tokens=512)"));
    CHECK(l.output.find("val       | after the last step") < l.output.find("step 6/6"));
  }
}

TEST_CASE("checkpoint.final=false: no final checkpoint, and the done line and the report say so", "[report]") {
  CkptFixture fx("report_no_final");
  const std::string cfg = write_config(fx, 6);
  const Launch l = run_command(std::string(PICOTRAIN_BIN) + " train --config " + cfg +
                               " --set checkpoint.every_steps=0 --set checkpoint.final=false");
  INFO(l.output);
  REQUIRE(l.exit_code == 0);
  CHECK_FALSE(fs::exists(fx.ckpt_dir()));
  CHECK_THAT(l.output, Contains("checkpoint| on stop signals only (checkpoint.final=false)"));
  CHECK_THAT(l.output, Contains("; no final checkpoint (checkpoint.final=false)\n"));
  const json r = check_report(fx.dir / "run");
  CHECK(r["checkpoint"]["final_checkpoint"].is_null());
  CHECK(r["checkpoint"]["writes"] == 0);
  CHECK_THAT(read_text((fx.dir / "run" / "report.md").string()),
             Contains("## Trained model") && Contains("was not saved: checkpoint.final=false"));
}

TEST_CASE("an FP8 run says so: the fp8 line, mfu_fp8 in metrics.jsonl, the report's precision and MFU", "[report][fp8]") {
  CkptFixture fx("report_fp8");
  const std::string cfg = write_config(fx, 3);
  const Launch l = run_command(std::string(PICOTRAIN_BIN) + " train --config " + cfg +
                               " --set precision.fp8=tensorwise --set precision.fp8_layers=qkv,mlp_down"
                               " --set logging.peak_tflops=1000 --set checkpoint.final=false");
  INFO(l.output);
  REQUIRE(l.exit_code == 0);
  // On the CPU the emulation's FP8 peak is the fp32 one (here the configured 1000 TFLOP/s).
  CHECK_THAT(l.output, Contains("fp8       | tensorwise: the products of qkv,mlp_down in FP8 (gradients e5m2); "
                                "mfu_fp8 = tflops_per_gpu / FP8 peak 1000.0000 TFLOP/s"));
  const json r = check_report(fx.dir / "run");
  CHECK(r["precision"]["fp8"] == "tensorwise");
  CHECK(r["precision"]["fp8_layers"] == "qkv,mlp_down");
  CHECK(r["throughput"]["mfu_fp8"].is_number());
  CHECK(r["throughput"]["mfu_fp8"].get<double>() == Approx(r["throughput"]["mfu"].get<double>()));
  CHECK_THAT(read_text((fx.dir / "run" / "report.md").string()),
             Contains("FP8 tensorwise products (layers qkv,mlp_down, gradients e5m2)") &&
                 Contains("| MFU against the FP8 peak |"));
  CHECK(r["precision"]["matmul_algos"] == "heuristic");
  // Without FP8: no fp8 line, no field. (With timed matmul algorithms, which the CPU backend has
  // none of: the log says so, the report keeps the setting.)
  const Launch off = run_command(std::string(PICOTRAIN_BIN) + " train --config " + cfg +
                                 " --set logging.peak_tflops=1000 --set checkpoint.final=false"
                                 " --set precision.matmul_algos=timed");
  CHECK_THAT(off.output, !Contains("fp8       |"));
  CHECK_THAT(off.output, Contains("matmul    | precision.matmul_algos=timed: the cpu backend has no algorithms"));
  const json r_off = check_report(fx.dir / "run");
  CHECK(r_off["throughput"]["mfu_fp8"].is_null());
  CHECK(r_off["precision"]["matmul_algos"] == "timed");
  CHECK_THAT(read_text((fx.dir / "run" / "report.md").string()), Contains("; matmul algorithms timed in the first step"));
}

TEST_CASE("an MFU above 100% is never printed without a warning that the peak is wrong", "[report]") {
  CkptFixture fx("report_mfu_high");
  const std::string cfg = write_config(fx, 3);
  // A peak no device is below: every step's MFU is far above 100%.
  const Launch l = run_command(std::string(PICOTRAIN_BIN) + " train --config " + cfg +
                               " --set logging.peak_tflops=1e-9 --set checkpoint.final=false");
  INFO(l.output);
  REQUIRE(l.exit_code == 0);
  CHECK_THAT(l.output, Contains("warning: step 1 ran at ") && Contains("MFU, above 100%") &&
                           Contains("(logging.peak_tflops)") && Contains("set logging.peak_tflops"));
  const size_t first = l.output.find("above 100%");
  CHECK(l.output.find("above 100%", first + 1) == std::string::npos);  // once, not every step
  // A plausible peak: no warning.
  const Launch ok = run_command(std::string(PICOTRAIN_BIN) + " train --config " + cfg +
                                " --set logging.peak_tflops=1000 --set checkpoint.final=false");
  CHECK_THAT(ok.output, !Contains("above 100%"));
}

TEST_CASE("a long piece of work logs its progress every interval, with an ETA", "[report]") {
  WorkProgress p("val", "batches", 17, 10.0);
  CHECK_FALSE(p.update(1, 2.0));   // within the first interval: nothing
  CHECK_FALSE(p.update(4, 9.9));
  const auto first = p.update(8, 10.0);
  REQUIRE(first);
  CHECK(*first == "val       | 8/17 batches in 10 s, ETA 11s");  // 9 left at 1.25 s each
  CHECK_FALSE(p.update(9, 15.0));  // the next one 10 s after the last
  CHECK(p.update(12, 20.5));
  CHECK_FALSE(p.update(17, 40.0));  // done: the caller's own line says so
  CHECK_FALSE(WorkProgress("val", "batches", 5).update(0, 30.0));  // nothing done yet: no pace
}

TEST_CASE("with samples in the log, the report shows the log's final sample", "[report]") {
  CkptFixture fx("report_logged_sample");
  const std::string cfg = write_config(fx, 12);
  const Launch l = run_command(std::string(PICOTRAIN_BIN) + " train --config " + cfg + " --set logging.sample_every=6");
  INFO(l.output);
  REQUIRE(l.exit_code == 0);
  // The log's header of the final sample: "sample    | step 12, N tokens (settings):".
  const std::string head = "sample    | step 12, ";
  const size_t at = l.output.find(head);
  REQUIRE(at != std::string::npos);
  const std::string tokens = l.output.substr(at + head.size(), l.output.find(" tokens", at) - at - head.size());
  const json r = check_report(fx.dir / "run");
  const std::string note = r["sample"]["note"].get<std::string>();
  CHECK(note.rfind(tokens + " tokens after the prompt", 0) == 0);
  const std::string settings = l.output.substr(l.output.find('(', at) + 1, l.output.find("):", at) - l.output.find('(', at) - 1);
  CHECK_THAT(note, Contains(settings));
  // The report's text is the log's (first line: the prompt and the start of the continuation).
  const size_t text_at = l.output.find("          | ", at) + 12;
  const std::string first_line = l.output.substr(text_at, l.output.find('\n', text_at) - text_at);
  CHECK(r["sample"]["text"].get<std::string>().rfind(first_line.substr(0, 3), 0) == 0);
}

TEST_CASE("a run stopped by SIGTERM reports the stop; resumed, it reports the whole run", "[report]") {
  CkptFixture fx("report_sigterm");
  const int total = 60;  // the signal lands long before the end, however fast the machine
  const std::string cfg = write_config(fx, total);
  const std::string err = (fx.dir / "stderr.txt").string();
  // Samples on, but not before the end: the stopped run's report samples the weights it stopped
  // with (gathered for the report, not the log's).
  Child run = start_train(cfg, {"logging.sample_every=1000"}, err);
  int seen = 0;
  read_until_step_lines(run.out, 3, &seen);
  REQUIRE(seen == 3);
  kill(run.pid, SIGTERM);
  const std::string log = drain(run.out);
  REQUIRE(wait_exit_code(run.pid) == 0);
  INFO(log);
  const json stopped = check_report(fx.dir / "run");
  const int stop_step = stopped["run"]["step"].get<int>();
  REQUIRE(stop_step < total);
  CHECK(stopped["run"]["status"] == "stopped");
  CHECK_THAT(stopped["run"]["stop_reason"].get<std::string>(), Contains("SIGTERM after step " + std::to_string(stop_step)));
  CHECK(stopped["checkpoint"]["writes"].get<int>() >= 1);  // the stop's checkpoint
  CHECK(stopped["time"]["steps"] == stop_step);
  CHECK(stopped["sample"]["text"].get<std::string>().rfind("The", 0) == 0);  // logging.sample_prompt's default
  CHECK(stopped["time"]["sample_s"].get<double>() > 0);

  const Launch resumed = run_command(std::string(PICOTRAIN_BIN) + " train --config " + cfg +
                                     " --set checkpoint.resume=auto");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const json r = check_report(fx.dir / "run");
  CHECK(r["run"]["status"] == "finished");
  CHECK(r["reliability"]["sessions"] == 2);
  CHECK(r["reliability"]["restarts"] == 1);
  CHECK(r["reliability"]["crashed_sessions"] == 0);
  CHECK(r["time"]["steps"] == total);  // both sessions' steps
  const Sums s = metric_sums(fx.dir / "run");
  CHECK(r["time"]["steps_s"].get<double>() == Approx(s.dt));
}

TEST_CASE("a crashed run (SIGKILL) counts as a crashed session once resumed", "[report]") {
  CkptFixture fx("report_crash");
  const int total = 60;  // the signal lands long before the end, however fast the machine
  const std::string cfg = write_config(fx, total);
  const std::string err = (fx.dir / "stderr.txt").string();
  Child run = start_train(cfg, {}, err);
  int seen = 0;
  read_until_step_lines(run.out, 9, &seen);  // past the checkpoint of step 8
  REQUIRE(seen == 9);
  kill(run.pid, SIGKILL);
  drain(run.out);
  REQUIRE(wait_exit_code(run.pid) == 128 + SIGKILL);
  CHECK_FALSE(fs::exists(fx.dir / "run" / "report.json"));  // a crash writes no report

  const Launch resumed = run_command(std::string(PICOTRAIN_BIN) + " train --config " + cfg +
                                     " --set checkpoint.resume=auto");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const json r = check_report(fx.dir / "run");
  CHECK(r["reliability"]["sessions"] == 2);
  CHECK(r["reliability"]["restarts"] == 1);
  CHECK(r["reliability"]["crashed_sessions"] == 1);
  // Only the resumed session's steps are counted: the crashed one left no account of its time.
  const std::vector<json> sessions = SessionLog((fx.dir / "run" / "sessions.jsonl").string(), false).records();
  REQUIRE(sessions.size() == 3);  // start, start, end
  CHECK(sessions[1]["step"].get<int>() >= 8);
  CHECK(r["time"]["steps"].get<int>() == total - sessions[1]["step"].get<int>());
}
