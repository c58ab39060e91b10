// The planner's time model against measurements: its kernel table is our H100 benchmark's
// (row by row against bench/runs/2026-11-26-h100-bench.md), a call's time is the measured one
// where the table has the shape and the documented fallback curve where it does not,
// `plan --kernels FILE` reads kernel_bench --json, and the predicted one-GPU step times of GPT-2
// 124M and 1.5B are within 10% of the steps measured on that H100.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/metrics/flops.h"
#include "core/plan/comm_model.h"
#include "core/plan/hardware_profiles.h"
#include "core/plan/kernel_table.h"
#include "core/plan/plan.h"
#include "core/plan/stage_compute.h"
#include "core/train/pp_bubble.h"
#include "core/train/pp_simulator.h"
#include "run_test_support.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kH100Report = std::string(PICOTRAIN_SOURCE_DIR) + "/bench/runs/2026-11-26-h100-bench.md";

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The report's per-kernel table rows: "| op | shape | median us | work | formula | achieved | ...".
struct ReportRow {
  std::string op, shape;
  double median_us, rate;
};
std::vector<ReportRow> report_rows(const std::string& md) {
  std::vector<ReportRow> out;
  std::istringstream in(md);
  bool in_kernels = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) in_kernels = line.find("Per-kernel table") != std::string::npos;
    if (!in_kernels || line.rfind("| ", 0) != 0 || line.rfind("| op ", 0) == 0) continue;
    std::vector<std::string> cells;
    std::istringstream cols(line.substr(1));
    for (std::string c; std::getline(cols, c, '|');) cells.push_back(c.substr(1, c.size() - 2));
    if (cells.size() < 6 || cells[0] == "attention_fwd+bwd") continue;
    out.push_back({cells[0], cells[1], std::stod(cells[2]), std::stod(cells[5])});
  }
  return out;
}

Plan one_gpu_plan(const std::string& config, const std::vector<std::string>& sets, const Hardware& hw = {}) {
  return make_plan(std::string(PICOTRAIN_SOURCE_DIR) + "/configs/" + config, sets, 1, hw);
}

// The layout of `plan` with the same dp/tp/pp/cp as `l` (a search's choice against the plan
// without it); null when there is none.
const LayoutPlan* same_layout(const Plan& plan, const LayoutPlan& l) {
  for (const LayoutPlan& p : plan.layouts)
    if (p.layout.name() == l.layout.name()) return &p;
  return nullptr;
}

}  // namespace

TEST_CASE("the compiled-in kernel table is the H100 report's, row by row", "[plan]") {
  const KernelTable& k = KernelTable::h100();
  CHECK(k.device == "NVIDIA H100 80GB HBM3");
  CHECK(k.flop_ceiling_tflops == 794.4);
  CHECK(k.bandwidth_ceiling_gbps == 3001);
  const std::vector<ReportRow> report = report_rows(read_text(kH100Report));
  REQUIRE(report.size() == k.rows.size());
  for (size_t i = 0; i < report.size(); i++) {
    INFO(report[i].op << " " << report[i].shape);
    CHECK(k.rows[i].op == report[i].op);
    CHECK(k.rows[i].shape == report[i].shape);
    CHECK(k.rows[i].median_ms * 1000 == Approx(report[i].median_us));
    CHECK(k.rows[i].rate == report[i].rate);
  }
}

TEST_CASE("a kernel's time: measured where the table has the shape, the fallback curve elsewhere", "[plan]") {
  const KernelTable& k = KernelTable::h100();
  // Measured: GPT-2 124M's qkv matmul at N=65536 ran at 685.0 TFLOP/s forward, 572.5 backward;
  // a nearby N (within 2x) takes the same rate.
  const double fl = 2.0 * 65536 * 768 * 2304;
  CHECK(k.matmul_s(65536, 768, 2304, false) == Approx(fl / 685.0e12));
  CHECK(k.matmul_s(65536, 768, 2304, true) == Approx(2 * fl / 572.5e12));
  CHECK(k.matmul_s(40000, 768, 2304, false) == Approx(2.0 * 40000 * 768 * 2304 / 685.0e12));
  // Not measured: the roofline at the median efficiency of the measured matmuls of that direction.
  const double e_fwd = k.matmul_efficiency(false), e_bwd = k.matmul_efficiency(true);
  CHECK(e_fwd > 0.8);   // H100: 0.86 of the large-matmul ceiling forward
  CHECK(e_bwd < e_fwd);  // and less backward (0.78)
  const double big = 2.0 * 8192 * 16384 * 53248;
  CHECK(k.matmul_s(8192, 16384, 53248, false) == Approx(big / (794.4e12 * e_fwd)));
  // A skinny matmul is bandwidth-bound on the same curve.
  const double bytes = 2.0 * (8.0 * 8192 + 8192.0 * 8192 + 8.0 * 8192);
  CHECK(k.matmul_s(8, 8192, 8192, false) == Approx(bytes / 3001e9));

  // Attention: the measured shape exactly; T = 2048 (hd 128) between the rates at 1024 and 4096.
  const double a1 = 4.0 * 16 * 16 * 1024.0 * 1024 * 128 / 2;
  CHECK(k.attention_s(16, 16, 1024, 128, false) == Approx(a1 / 103.6e12));
  const double a2 = 4.0 * 8 * 16 * 2048.0 * 2048 * 128 / 2;
  const double rate = a2 / k.attention_s(8, 16, 2048, 128, false) / 1e12;
  CHECK(rate == Approx(0.5 * 103.6 + 0.5 * 116.8));
  CHECK(a2 * 64 / k.attention_s(8, 16, 2048 * 8, 128, false) / 1e12 == Approx(122.9));  // past the end: held

  // Memory-bound: the op's own rate at the nearest size; a kernel never measured at the median.
  CHECK(k.memory_s("gelu_forward", 805.3e6) == Approx(805.3e6 / 2974e9));
  CHECK(k.memory_s("swiglu_forward", 1e9) == Approx(1e9 / (3001e9 * k.memory_efficiency())));
  CHECK(k.memory_efficiency() > 0.5);
  CHECK(k.memory_efficiency() < 1.0);
}

// The steps measured on one H100 (bench/runs/2026-11-26-h100-bench.md, "Training runs":
// picotrain 124M 1174.1 ms per step of 64 x 8 x 1024 tokens; 1.5B 3196.6 ms per step of 8 x 16 x
// 1024 tokens; bf16, ZeRO-0, no recompute, as bench/gpu_bench.sh runs them).
TEST_CASE("one-GPU step times of GPT-2 124M and 1.5B are within 10% of the H100's", "[plan]") {
  struct Run {
    const char* config;
    int micro, accum;
    double measured_ms;
  };
  for (const Run& r : {Run{"gpt2-124m.json", 64, 8, 1174.1}, Run{"gpt2-1.5b.json", 8, 16, 3196.6}}) {
    INFO(r.config);
    const Plan plan = one_gpu_plan(r.config, {"batch.micro_batch_size=" + std::to_string(r.micro),
                                              "batch.global_batch_tokens=" + std::to_string(r.micro * r.accum * 1024),
                                              "parallel.zero_stage=0"});
    REQUIRE(plan.layouts.size() == 1);
    const StepTime& t = plan.layouts[0].time;
    CHECK(plan.layouts[0].layout.cfg.batch.grad_accum_steps == r.accum);
    CHECK(t.comm_s() == 0);
    CHECK(t.optimizer_s > 0);
    CHECK(t.step_s * 1e3 == Approx(r.measured_ms).epsilon(0.10));
  }
}

TEST_CASE("the flat --mfu model is kept, and the kernel model's compute is the stages'", "[plan]") {
  const std::vector<std::string> sets = {"batch.micro_batch_size=64", "batch.global_batch_tokens=524288",
                                         "recompute.mode=selective"};
  Hardware flat;
  flat.mfu = 0.5;
  const Plan a = one_gpu_plan("gpt2-124m.json", sets, flat), b = one_gpu_plan("gpt2-124m.json", sets);
  const StepTime &ta = a.layouts[0].time, &tb = b.layouts[0].time;
  CHECK(ta.optimizer_s == 0);
  CHECK(ta.recompute_s == Approx(ta.compute_s * 4 * 12 * 768 * 1024 /
                                 flops_per_token(build_param_table(a.example.model), a.example.model, 1024, "palm")));
  const std::vector<StageCompute> st = stage_compute(b.example, KernelTable::h100());
  REQUIRE(st.size() == 1);
  CHECK(tb.compute_s == Approx(8 * (st[0].forward_s + st[0].backward_s)));
  CHECK(tb.recompute_s == Approx(8 * st[0].recompute_s));
  CHECK(tb.recompute_s > 0);
  CHECK(tb.recompute_s < 0.1 * tb.compute_s);  // attention's forward only
}

TEST_CASE("plan --kernels reads kernel_bench --json; a bad table exits 2 naming the key", "[plan]") {
  const fs::path dir = fs::temp_directory_path() / ("picotrain_kernels_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // The H100 table with every rate halved: a GPU half as fast everywhere takes twice the compute.
  nlohmann::json j = nlohmann::json::parse(h100_kernel_table_json());
  for (auto& r : j["rows"]) {
    r["rate"] = r["rate"].get<double>() / 2;
    r["median_ms"] = r["median_ms"].get<double>() * 2;
  }
  j["flop_ceiling_tflops"] = j["flop_ceiling_tflops"].get<double>() / 2;
  j["bandwidth_ceiling_gbps"] = j["bandwidth_ceiling_gbps"].get<double>() / 2;
  const std::string slow = (dir / "slow.json").string();
  std::ofstream(slow) << j.dump();
  Hardware hw;
  hw.kernels = std::make_shared<KernelTable>(KernelTable::from_file(slow));
  const std::vector<std::string> sets = {"batch.micro_batch_size=8", "batch.global_batch_tokens=65536"};
  const Plan fast = one_gpu_plan("gpt2-124m.json", sets), half = one_gpu_plan("gpt2-124m.json", sets, hw);
  CHECK(half.layouts[0].time.compute_s == Approx(2 * fast.layouts[0].time.compute_s));

  const std::string cfg = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/gpt2-124m.json";
  const Launch ok = run_command(std::string(PICOTRAIN_BIN) + " plan --config " + cfg + " --gpus 1 --kernels " + slow);
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Contains(slow));
  j.erase("flop_ceiling_tflops");
  const std::string bad = (dir / "bad.json").string();
  std::ofstream(bad) << j.dump();
  const Launch refused = run_command(std::string(PICOTRAIN_BIN) + " plan --config " + cfg + " --gpus 1 --kernels " + bad);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Contains("flop_ceiling_tflops"));
  fs::remove_all(dir);
}

TEST_CASE("--gpu profiles carry the datasheet numbers; flags override any of them", "[plan]") {
  const GpuProfile& h200 = gpu_profile("h200");
  CHECK(h200.peak_bf16_tflops == 989.4);
  CHECK(h200.memory_gib == 141);
  CHECK(h200.hbm_gbps == 4800);
  CHECK(gpu_profile("a100-80g").peak_bf16_tflops == 312);
  CHECK(gpu_profile("a100-40g").hbm_gbps == 1555);
  CHECK(gpu_profile("b200").peak_bf16_tflops == 2250);
  // The profiles agree with the trainer's own peak table where both name a GPU.
  CHECK(gpu_profile("h100-sxm").peak_bf16_tflops == gpu_peak_tflops("NVIDIA H100 80GB HBM3"));
  CHECK(gpu_profile("h100-pcie").peak_bf16_tflops == gpu_peak_tflops("NVIDIA H100 PCIe"));
  CHECK(gpu_profile("a100-80g").peak_bf16_tflops == gpu_peak_tflops("NVIDIA A100-SXM4-80GB"));
  CHECK_THROWS_WITH(gpu_profile("v100"), Contains("a100-40g, a100-80g, h100-sxm, h100-pcie, h200, b200"));
  // The default Hardware is the h100-sxm profile.
  const Hardware def, h100 = hardware_of(gpu_profile("h100-sxm"), 8);
  CHECK(def.peak_tflops == h100.peak_tflops);
  CHECK(def.gpu_memory_gib == h100.gpu_memory_gib);
  CHECK(def.hbm_gbps == h100.hbm_gbps);
  CHECK(def.nvlink_gbps == h100.nvlink_gbps);
  CHECK(def.network_gbps == h100.network_gbps);

  // Another GPU gets the H100 table scaled: the H200's matmuls as fast (same tensor cores), its
  // memory-bound kernels 4.8/3.35 faster; the B200's matmuls 2250/989.4 faster.
  const std::vector<std::string> sets = {"batch.micro_batch_size=8", "batch.global_batch_tokens=65536"};
  const Plan on_h100 = one_gpu_plan("gpt2-124m.json", sets);
  const Plan on_h200 = one_gpu_plan("gpt2-124m.json", sets, hardware_of(h200, 8));
  const Plan on_b200 = one_gpu_plan("gpt2-124m.json", sets, hardware_of(gpu_profile("b200"), 8));
  const double t100 = on_h100.layouts[0].time.compute_s;
  CHECK(on_h200.layouts[0].time.compute_s < t100);
  CHECK(on_h200.layouts[0].time.compute_s > t100 / (4800.0 / 3350));
  CHECK(on_h200.layouts[0].time.optimizer_s == Approx(on_h100.layouts[0].time.optimizer_s * 3350 / 4800));
  CHECK(on_b200.layouts[0].time.compute_s < on_h200.layouts[0].time.compute_s);
  CHECK(on_b200.layouts[0].time.compute_s > t100 / (8000.0 / 3350) * 0.999);

  const std::string cfg = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/gpt2-124m.json";
  const Launch b200 = run_command(std::string(PICOTRAIN_BIN) + " plan --config " + cfg + " --gpus 8 --gpu b200");
  INFO(b200.output);
  CHECK(b200.exit_code == 0);
  CHECK_THAT(b200.output, Contains("b200: 2250.0 TFLOP/s dense bf16, 180 GiB, HBM 8000 GB/s"));
  CHECK_THAT(b200.output, Contains("NVLink 900 GB/s"));
  const Launch over = run_command(std::string(PICOTRAIN_BIN) + " plan --config " + cfg +
                                  " --gpus 8 --gpu a100-80g --peak-tflops 300 --nvlink-gbps 200");
  CHECK(over.exit_code == 0);
  CHECK_THAT(over.output, Contains("a100-80g: 300.0 TFLOP/s dense bf16, 80 GiB, HBM 2039 GB/s"));
  CHECK_THAT(over.output, Contains("NVLink 200 GB/s"));
  const Launch bad = run_command(std::string(PICOTRAIN_BIN) + " plan --config " + cfg + " --gpus 8 --gpu v100");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Contains("--gpu v100"));
  CHECK_THAT(bad.output, Contains("h100-pcie"));
}

TEST_CASE("collectives: alpha-beta with the ring or tree bus factor; overlap hides what compute covers", "[plan]") {
  const Link nvlink{450, 2e-6};
  const double gb = 1e9;
  // Ring all-reduce of 1 GB over 8: 14 steps of latency, 2*7/8 of the buffer.
  CHECK(collective_s(Collective::all_reduce, gb, 8, nvlink) == Approx(14 * 2e-6 + 1.75 * gb / 450e9));
  CHECK(collective_s(Collective::all_gather, gb, 8, nvlink) == Approx(7 * 2e-6 + 0.875 * gb / 450e9));
  CHECK(collective_s(Collective::reduce_scatter, gb, 1, nvlink) == 0);
  CHECK(collective_s(Collective::send, gb, 2, nvlink) == Approx(2e-6 + gb / 450e9));
  // A small buffer on many ranks: the tree's 2 log2(n) steps beat the ring's 2(n-1).
  const double tree = 2 * 10 * 6e-6 + 2 * 1e3 / 50e9;
  CHECK(collective_s(Collective::all_reduce, 1e3, 1024, Link{50, 6e-6}) == Approx(tree));
  // What a compute window cannot hide, never less than the tail after it.
  CHECK(exposed_s(10, 4) == 6);
  CHECK(exposed_s(10, 40) == 0);
  CHECK(exposed_s(10, 40, 1) == 1);
  CHECK(exposed_s(0.5, 40, 1) == 0.5);

  // The trainer's schedule: ZeRO-1 gradient buckets run beside the last backward. GPT-2 124M on
  // 8 nodes of one GPU (dp over the network): part of the reduce-scatter is hidden; with nothing
  // overlapped it is all exposed, and tp overlap hides tp's all-reduces.
  const std::string cfg = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/gpt2-124m.json";
  Hardware hw;
  hw.gpus_per_node = 1;
  Hardware none = hw;
  none.overlap.dp_grads = false;
  const Plan a = make_plan(cfg, {}, 8, hw), b = make_plan(cfg, {}, 8, none);
  auto find = [](const Plan& p, const std::string& name) -> const StepTime& {
    for (const auto& l : p.layouts)
      if (l.layout.name() == name) return l.time;
    FAIL("no layout " << name);
    throw;
  };
  const StepTime &dp_overlap = find(a, "dp8 tp1 pp1 cp1"), &dp_exposed = find(b, "dp8 tp1 pp1 cp1");
  CHECK(dp_exposed.hidden_s == 0);
  CHECK(dp_overlap.hidden_s > 0);
  CHECK(dp_overlap.dp_s + dp_overlap.hidden_s == Approx(dp_exposed.dp_s));
  CHECK(dp_overlap.step_s < dp_exposed.step_s);
  Hardware tp_overlap = hw;
  tp_overlap.overlap.tp = true;
  const Plan c = make_plan(cfg, {}, 8, tp_overlap);
  CHECK(find(c, "dp4 tp2 pp1 cp1").tp_s < find(a, "dp4 tp2 pp1 cp1").tp_s);
  CHECK_THAT(format_plan(c, tp_overlap, cfg), Contains("overlapped with compute: dp grads, tp; exposed: zero, cp"));
}

TEST_CASE("the pipeline bubble comes from simulating the schedule, uneven stages included", "[plan]") {
  // The simulator's per-rank scale: all 1 changes nothing, all 2 doubles every time, an uneven
  // pipeline lies between its slowest and fastest even ones.
  const int pp = 4, m = 8;
  std::vector<std::vector<PipeAction>> lists;
  for (int r = 0; r < pp; r++) lists.push_back(pipeline_schedule(PipeSchedule::one_f_one_b, pp, 1, m, r));
  auto makespan = [&](std::vector<double> scale) {
    PipeCosts costs;
    costs.rank_scale = std::move(scale);
    const PipeSimReport rep = simulate_pipeline(lists, 1, m, costs, PipeComm::blocking);
    REQUIRE(rep.ok());
    return rep.makespan;
  };
  const double even = makespan({});
  CHECK(even == Approx((m + pp - 1) * 3.0));  // (m + pp - 1)(F + B), pp_bubble.h
  CHECK(makespan({1, 1, 1, 1}) == even);
  CHECK(makespan({2, 2, 2, 2}) == Approx(2 * even));
  const double uneven = makespan({1, 0.5, 0.5, 0.5});
  CHECK(uneven < even);
  CHECK(uneven > makespan({0.5, 0.5, 0.5, 0.5}));
  CHECK_THROWS_WITH(simulate_pipeline(lists, 1, m, PipeCosts{1, 2, {1, 1}}), Contains("one factor per pipeline rank"));

  // The planner: GPT-2 124M on pp2 (dp4, 2 micro-batches each) in the measured-kernel model. The
  // step is the simulated makespan plus what follows it; the first stage (embeddings) and the
  // last (head, loss) differ, and the bubble is near 1F1B's (pp-1)/m of the busy time.
  const Plan plan = make_plan(std::string(PICOTRAIN_SOURCE_DIR) + "/configs/gpt2-124m.json",
                              {"batch.micro_batch_size=16"}, 8, Hardware{});
  int found = 0;
  for (const LayoutPlan& l : plan.layouts) {
    if (l.layout.name() != "dp4 tp1 pp2 cp1") continue;
    found++;
    const StepTime& t = l.time;
    const int micro = l.layout.cfg.batch.grad_accum_steps;
    const double busy = t.compute_s + t.recompute_s + t.tp_s + t.cp_s + t.pp_s + t.ep_s;
    CHECK(t.step_s == Approx(busy + t.bubble_s + t.dp_s + t.optimizer_s));
    const double formula = busy * pipeline_bubble_ratio(PipeSchedule::one_f_one_b, 2, 1, micro);
    CHECK(t.bubble_s > 0.5 * formula);
    CHECK(t.bubble_s <= formula * 1.0001);
    const std::vector<StageCompute> st = stage_compute(l.layout.cfg, KernelTable::h100());
    CHECK(st[0].total_s() != Approx(st[1].total_s()));
  }
  CHECK(found == 1);
}

TEST_CASE("--search-micro-batch keeps each layout's fastest micro-batch size that fits", "[plan]") {
  const std::string cfg = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/gpt2-124m.json";
  const Plan fixed = make_plan(cfg, {}, 16, Hardware{});
  const Plan searched = make_plan(cfg, {}, 16, Hardware{}, PlanSearch{.micro_batches = true});
  REQUIRE(fixed.layouts.size() == searched.layouts.size());
  int changed = 0;
  for (const LayoutPlan& s : searched.layouts) {
    INFO(s.layout.name());
    const LayoutPlan* f = same_layout(fixed, s);
    REQUIRE(f != nullptr);
    CHECK(s.time.step_s <= f->time.step_s);
    const int mbs = s.layout.cfg.batch.micro_batch_size;
    CHECK(64 % mbs == 0);  // the config's 64, halved
    if (mbs != 64) {
      changed++;
      CHECK(s.layout.cfg.batch.grad_accum_steps == f->layout.cfg.batch.grad_accum_steps * (64 / mbs));
      CHECK(s.time.step_s < f->time.step_s);
    }
  }
  CHECK(changed > 0);  // the pipeline layouts gain most: a smaller bubble
  const Launch out = run_command(std::string(PICOTRAIN_BIN) + " plan --config " + cfg + " --gpus 16 --search-micro-batch");
  CHECK(out.exit_code == 0);
  CHECK_THAT(out.output, Contains("micro accum"));
}

TEST_CASE("even_pp_layers: as even as the blocks go, the first and last stages lighter", "[plan]") {
  // Llama 3 405B's 126 layers on pp16, as the Llama 3 paper ran them (one layer off the first
  // and the last stage): configs/llama3-405b.json's own split.
  std::vector<int> v1 = {7};
  for (int i = 0; i < 14; i++) v1.push_back(8);
  v1.push_back(7);
  CHECK(even_pp_layers(126, 16) == v1);
  // Interleaved over 2 virtual stages: 32 chunks of 3 or 4 blocks, the lighter at the ends.
  const std::vector<int> v2 = even_pp_layers(126, 32);
  CHECK(v2.size() == 32);
  CHECK(v2.front() == 3);
  CHECK(v2.back() == 3);
  CHECK(std::count(v2.begin(), v2.end(), 4) == 30);
  CHECK(even_pp_layers(10, 4) == std::vector<int>{2, 3, 3, 2});
  CHECK(even_pp_layers(11, 4) == std::vector<int>{2, 3, 3, 3});
  CHECK(even_pp_layers(12, 4) == std::vector<int>{3, 3, 3, 3});
  CHECK_THROWS_AS(even_pp_layers(3, 4), ConfigError);
}

TEST_CASE("--search-pipeline tries interleaved with each v and keeps the fastest that fits", "[plan]") {
  // GPT-2 124M cut to 10 layers, micro-batches of 32: no v >= 2 divides 10 blocks over pp2
  // evenly, so each interleaved variant carries its own pp_layers.
  const std::string cfg = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/gpt2-124m.json";
  const std::vector<std::string> sets = {"batch.micro_batch_size=32", "model.n_layers=10"};
  const Plan fixed = make_plan(cfg, sets, 4, Hardware{});
  const Plan searched = make_plan(cfg, sets, 4, Hardware{}, PlanSearch{.pipeline_schedules = true});
  REQUIRE(fixed.layouts.size() == searched.layouts.size());
  int interleaved = 0;
  for (const LayoutPlan& s : searched.layouts) {
    INFO(s.layout.name());
    const LayoutPlan* f = same_layout(fixed, s);
    REQUIRE(f != nullptr);
    CHECK(s.time.step_s <= f->time.step_s);
    const ParallelSection& par = s.layout.cfg.parallel;
    if (par.pp_schedule != "interleaved") continue;
    interleaved++;
    CHECK(s.time.step_s < f->time.step_s);  // chosen only when faster
    CHECK(s.time.bubble_s < f->time.bubble_s);
    CHECK(par.pp_virtual_stages >= 2);
    CHECK(par.pp_virtual_stages <= kMaxVirtualStages);
    CHECK(par.pp_layers == even_pp_layers(10, par.pp * par.pp_virtual_stages));
    // Megatron's rule (pp_schedule.cpp): micro-batches enter the chunks in groups of pp.
    CHECK(s.layout.cfg.batch.grad_accum_steps % par.pp == 0);
  }
  CHECK(interleaved > 0);  // dp2 pp2 (8 micro-batches): a quarter-size bubble outweighs more sends
}

TEST_CASE("an interleaved layout whose micro-batch count is not a multiple of pp is not valid", "[plan]") {
  // gpt2-124m: 512 sequences of 64 per micro-batch; dp4 pp2: 2 micro-batches, fine; dp4 pp4 (16
  // GPUs): also 2, not a multiple of 4, refused by the schedule, as `picotrain train` would.
  const std::string cfg = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/gpt2-124m.json";
  const Plan plan = make_plan(cfg, {"parallel.pp_schedule=interleaved", "parallel.pp_virtual_stages=3"}, 16, Hardware{});
  const auto bad = std::find_if(plan.invalid.begin(), plan.invalid.end(),
                                [](const LayoutCandidate& c) { return c.name() == "dp4 tp1 pp4 cp1"; });
  REQUIRE(bad != plan.invalid.end());
  CHECK_THAT(bad->invalid, Contains("batch.grad_accum_steps=2"));
  CHECK_THAT(bad->invalid, Contains("multiple of parallel.pp=4"));
  const Launch out =
      run_command(std::string(PICOTRAIN_BIN) + " plan --config " + cfg + " --gpus 16 --search-pipeline");
  CHECK(out.exit_code == 0);
  CHECK_THAT(out.output, Contains("sched micro accum"));
}

TEST_CASE("plan --json: each layout's breakdown sums to its step; the why line names #1 and #2", "[plan]") {
  const std::string cfg = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/gpt2-124m.json";
  const std::string cmd = std::string(PICOTRAIN_BIN) + " plan --config " + cfg + " --gpus 4 --set model.n_layers=10";
  const Launch out = run_command(cmd + " --json");
  REQUIRE(out.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(out.output.substr(out.output.find('{')));
  const Plan plan = make_plan(cfg, {"model.n_layers=10"}, 4, Hardware{});
  REQUIRE(j["layouts"].size() == plan.layouts.size());
  REQUIRE(j["invalid"].size() == plan.invalid.size());
  CHECK_THAT(j["invalid"][0]["rule"].get<std::string>(), Contains("model.n_layers=10 must be divisible"));
  for (size_t i = 0; i < plan.layouts.size(); i++) {
    const nlohmann::json& l = j["layouts"][i];
    INFO(l.dump());
    CHECK(l["layout"] == plan.layouts[i].layout.name());
    const nlohmann::json& ms = l["time_ms"];
    double sum = 0;
    for (const char* part : {"compute", "recompute", "bubble", "optimizer"}) sum += ms[part].get<double>();
    for (const char* axis : {"tp", "cp", "pp", "ep", "dp"}) sum += ms["exposed_comm"][axis].get<double>();
    CHECK(sum == Approx(ms["step"].get<double>()).epsilon(1e-9));
    CHECK(ms["step"].get<double>() == Approx(1e3 * plan.layouts[i].time.step_s));
    CHECK(l["memory_gib"]["total"].get<double>() == Approx(plan.layouts[i].peak().total() / (1024.0 * 1024 * 1024)));
    CHECK(l["binding"] == binding_constraint(plan.layouts[i]));
  }
  // dp4 beats dp2 cp2 on one node: ring attention's exchanges are the difference.
  CHECK(plan.layouts[0].layout.name() == "dp4 tp1 pp1 cp1");
  CHECK_THAT(j["why_best"].get<std::string>(), Contains("#1 dp4 tp1 pp1 cp1 before #2 " + plan.layouts[1].layout.name()));
  CHECK_THAT(binding_constraint(plan.layouts[0]), Contains("compute"));
  const Launch text = run_command(cmd);
  CHECK_THAT(text.output, Contains("why       | " + why_best(plan)));
}

TEST_CASE("precision.fp8: the FP8 layers' products at the FP8 rate, plus their casts (fewer delayed); refused without FP8",
          "[plan][fp8]") {
  // GPT-2 1.5B on one H100: 48 blocks, 16 micro-batches of 8 x 1024 tokens, d_model 1600.
  const std::vector<std::string> sets = {"batch.micro_batch_size=8", "batch.global_batch_tokens=131072",
                                         "parallel.zero_stage=0"};
  const auto with = [&](const std::string& layers, const std::string& recipe = "tensorwise") {
    std::vector<std::string> s = sets;
    s.push_back("precision.fp8=" + recipe);
    s.push_back("precision.fp8_layers=" + layers);
    return one_gpu_plan("gpt2-1.5b.json", s).layouts.at(0).time;
  };
  const StepTime bf16 = one_gpu_plan("gpt2-1.5b.json", sets).layouts.at(0).time;
  CHECK(bf16.fp8_casts_s == 0);
  // The bf16 time of one block's four linear layers (forward and backward), from the kernel table.
  const KernelTable& k = KernelTable::h100();
  const double n = 8 * 1024, c = 1600, f = 4 * 1600;
  const auto both = [&](double ic, double oc) { return k.matmul_s(n, ic, oc, false) + k.matmul_s(n, ic, oc, true); };
  const double per_block[] = {both(c, 3 * c), both(c, c), both(c, f), both(f, c)};  // qkv, attn_out, mlp_up, mlp_down
  const double speedup = Hardware{}.fp8_speedup, blocks_times_micro = 48 * 16;
  REQUIRE(speedup == Approx(2.0).epsilon(1e-3));  // H100 SXM: 1978.9 / 989.4 TFLOP/s
  double all_products = 0;
  for (double t : per_block) all_products += t;
  // All four layers: the products' saving is exactly (1 - 1/speedup) of their bf16 time; the
  // casts, a memory pass over each operand, come on top.
  const StepTime all = with("all");
  const double saving = bf16.compute_s - (all.compute_s - all.fp8_casts_s);
  CHECK(saving == Approx(blocks_times_micro * all_products * (1 - 1 / speedup)).epsilon(1e-6));
  // The casts' bytes per layer and micro-batch: each of x, w (forward) and dout, dout^T, w^T, x^T
  // (backward) read twice in bf16 (amax, then cast) and written once as bytes: 5 bytes a value.
  double cast_bytes = 0;
  for (auto [ic, oc] : {std::pair{c, 3 * c}, {c, c}, {c, f}, {f, c}})
    cast_bytes += 5 * (2 * n * ic + 2 * oc * ic + 2 * n * oc);
  cast_bytes *= blocks_times_micro;
  CHECK(all.fp8_casts_s > cast_bytes / 3.35e12);  // no faster than the H100's HBM
  CHECK(all.fp8_casts_s < cast_bytes / (0.3 * 3.35e12));
  CHECK(all.compute_s < bf16.compute_s);
  // Delayed scaling: the same products; each cast reads its operand once (the scale comes from
  // earlier steps: no amax pass), 3 bytes a value.
  const StepTime delayed = with("all", "delayed");
  CHECK(bf16.compute_s - (delayed.compute_s - delayed.fp8_casts_s) == Approx(saving).epsilon(1e-6));
  CHECK(delayed.fp8_casts_s > cast_bytes * 3 / 5 / 3.35e12);
  CHECK(delayed.fp8_casts_s < cast_bytes * 3 / 5 / (0.3 * 3.35e12));
  CHECK(delayed.fp8_casts_s < all.fp8_casts_s);
  // One layer only: its own saving, and its own casts.
  const StepTime qkv = with("qkv");
  CHECK(bf16.compute_s - (qkv.compute_s - qkv.fp8_casts_s) ==
        Approx(blocks_times_micro * per_block[0] * (1 - 1 / speedup)).epsilon(1e-6));
  CHECK(qkv.fp8_casts_s > 0);
  CHECK(qkv.fp8_casts_s < all.fp8_casts_s);
  // The LM head (asked for by name): its products' saving, once per micro-batch; its casts take
  // the weight [50304, 1600] once per chunk of rows (the 8192 x 50304 bf16 logits are 786 MiB:
  // two chunks under the 512 MiB budget), so two more weight casts than one pass would.
  const StepTime head = with("lm_head");
  const double V = 50304;
  CHECK(bf16.compute_s - (head.compute_s - head.fp8_casts_s) == Approx(16 * both(c, V) * (1 - 1 / speedup)).epsilon(1e-6));
  double head_bytes = 5 * (2 * n * c + 2 * V * c + 2 * n * V);
  head_bytes += 5 * 2 * V * c;  // the second chunk's weight casts, forward and backward
  CHECK(head.fp8_casts_s > 16 * head_bytes / 3.35e12);
  CHECK(head.fp8_casts_s < 16 * head_bytes / (0.3 * 3.35e12));
  const StepTime all_head = with("all,lm_head");
  CHECK(all_head.compute_s == Approx(all.compute_s + head.compute_s - bf16.compute_s).epsilon(1e-9));
  // Attention (asked for by name): its forward at the FP8 rate (25 heads of 64, causal over 1024),
  // its backward bf16's; a cast of q, k, v forward (5 bytes a value), and backward the same cast
  // plus the dequantised copy (1 byte read, 2 written).
  const StepTime attention = with("attention");
  const double attention_fwd = k.attention_s(8, 25, 1024, 64, false);
  CHECK(bf16.compute_s - (attention.compute_s - attention.fp8_casts_s) ==
        Approx(blocks_times_micro * attention_fwd * (1 - 1 / speedup)).epsilon(1e-6));
  const double qkv_bytes = blocks_times_micro * n * 3 * c * (5 + 5 + 3);
  CHECK(attention.fp8_casts_s > qkv_bytes / 3.35e12);
  CHECK(attention.fp8_casts_s < qkv_bytes / (0.3 * 3.35e12));
  // A GPU without FP8 tensor cores: a config error naming the key and the GPU.
  std::vector<std::string> a100 = sets;
  a100.push_back("precision.fp8=tensorwise");
  CHECK_THROWS_WITH(one_gpu_plan("gpt2-1.5b.json", a100, hardware_of(gpu_profile("a100-80g"), 8)),
                    Catch::Contains("precision.fp8=tensorwise") && Catch::Contains("a100-80g"));
}

TEST_CASE("precision.fp8: routed experts in FP8 (delayed) at the FP8 rate, each expert's weights cast", "[plan][fp8][moe]") {
  // tiny-moe: 4 sparse blocks of 8 experts (top 2, hidden 192), d_model 128; 2 micro-batches of
  // 8 x 64 tokens.
  const std::vector<std::string> sets = {"parallel.zero_stage=0", "precision.fp8=delayed"};
  const auto with = [&](const std::string& layers) {
    std::vector<std::string> s = sets;
    s.push_back("precision.fp8_layers=" + layers);
    return one_gpu_plan("tiny-moe.json", s).layouts.at(0).time;
  };
  const StepTime blocks = with("all"), experts = with("all,experts");
  const KernelTable& k = KernelTable::h100();
  const double rows = 8 * 64 * 2, c = 128, h = 192, speedup = Hardware{}.fp8_speedup;
  const auto both = [&](double ic, double oc) { return k.matmul_s(rows, ic, oc, false) + k.matmul_s(rows, ic, oc, true); };
  // The routed rows' up (gate and up, 2h) and down products, per sparse block and micro-batch.
  const double products = 4 * 2 * (both(c, 2 * h) + both(h, c));
  const double saving = (blocks.compute_s - blocks.fp8_casts_s) - (experts.compute_s - experts.fp8_casts_s);
  CHECK(saving == Approx(products * (1 - 1 / speedup)).epsilon(1e-6));
  // Their casts: under delayed scaling each operand read once and written as bytes (3 bytes a
  // bf16 value): x, dout twice and the 8 experts' weights, forward and backward, of both products.
  double bytes = 0;
  for (auto [ic, oc] : {std::pair{c, 2 * h}, {h, c}}) bytes += 3 * (2 * rows * ic + 2 * 8 * oc * ic + 2 * rows * oc);
  bytes *= 4 * 2;
  const double casts = experts.fp8_casts_s - blocks.fp8_casts_s;
  CHECK(casts > bytes / 3.35e12);
  CHECK(casts < bytes / (0.3 * 3.35e12));
}

TEST_CASE("routed experts are whole on every tp rank: all the rows without sequence parallel, n/tp with it",
          "[plan][moe]") {
  // tiny-moe on tp2 (4 blocks, 8 experts of hidden 192, top 2; dense blocks' MLP 384 wide). With
  // moe.every=2 two of the four blocks are dense; the difference to every=1 is two sparse blocks
  // less two dense ones, whose norms, attention and dense MLP cost the same with or without
  // sequence parallel. What is left is the router and the experts: without sequence parallel
  // they see every row of the micro-batch, with it the rank's half.
  const std::string cfg = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/tiny-moe.json";
  const auto stage_s = [&](bool sp, int every) {
    const Plan p = make_plan(cfg, {"parallel.sequence_parallel=" + std::string(sp ? "true" : "false"),
                                   "moe.every=" + std::to_string(every)},
                             2, Hardware{}, PlanSearch{.layout = "dp1 tp2 pp1 cp1"});
    return stage_compute(p.layouts.at(0).layout.cfg, KernelTable::h100()).at(0).total_s();
  };
  const KernelTable& k = KernelTable::h100();
  const double n = 8 * 64, c = 128, h = 192, e = 8, top = 2, s = 2;  // one micro-batch's rows; bf16
  const auto both = [&](double rows, double ic, double oc) {
    return k.matmul_s(rows, ic, oc, false) + k.matmul_s(rows, ic, oc, true);
  };
  // One sparse block's router [rows, c] x [c, e], experts' up [rows*top, c] x [c, 2h], SwiGLU,
  // and down [rows*top, h] x [h, c].
  const auto sparse = [&](double rows) {
    const double hidden = rows * top * h;
    return both(rows, c, e) + both(rows * top, c, 2 * h) + both(rows * top, h, c) +
           k.memory_s("swiglu_forward", 3 * hidden * s) + k.memory_s("swiglu_backward", 5 * hidden * s);
  };
  const double without = stage_s(false, 1) - stage_s(false, 2), with_sp = stage_s(true, 1) - stage_s(true, 2);
  CHECK(without - with_sp == Approx(2 * (sparse(n) - sparse(n / 2))).epsilon(1e-9));
  CHECK(without > with_sp);
}

TEST_CASE("precision.fp8 under ZeRO-3: the planner counts the FP8 weights' gathers at one byte", "[plan][fp8][zero]") {
  // GPT-2 1.5B over 8 GPUs of a node, ZeRO-3: every layer gathered in forward and backward.
  const auto dp_seconds = [](bool fp8_gather) {
    const Plan p = make_plan(std::string(PICOTRAIN_SOURCE_DIR) + "/configs/gpt2-1.5b.json",
                             {"parallel.zero_stage=3", "precision.fp8=tensorwise",
                              std::string("precision.fp8_weight_gather=") + (fp8_gather ? "true" : "false")},
                             8, Hardware{});
    for (const LayoutPlan& l : p.layouts)
      if (l.layout.name() == "dp8 tp1 pp1 cp1") return l.time.dp_s;
    FAIL("no dp8 layout");
    return 0.0;
  };
  const double fp8 = dp_seconds(true), bf16 = dp_seconds(false);
  INFO("exposed dp communication: FP8 gathers " << fp8 << " s, bf16 " << bf16 << " s");
  // Per parameter and micro-batch ZeRO-3 moves two gathers (forward, backward) of 2 bytes and a
  // reduce-scatter of the fp32 gradient, 4 bytes: 8 in all. The blocks' four weights (94% of the
  // parameters) gather in 1 byte instead: 2 x (0.94 + 0.06 x 2) + 4 = 6.1, 0.77 of bf16's.
  CHECK(fp8 < 0.8 * bf16);
  CHECK(fp8 > 0.7 * bf16);
}
