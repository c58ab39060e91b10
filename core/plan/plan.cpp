#include "core/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/common/format.h"
#include "core/metrics/flops.h"
#include "core/parallel/fp8_linear.h"
#include "core/plan/hardware_profiles.h"

namespace pt {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// What is too big, largest first, and what would shrink it. zero_ranks: the ranks ZeRO would
// shard over in this layout (dp / dp_replicate x cp); with one, every zero_stage holds the whole
// model (ShardLayout::single_shard), so a higher stage is no remedy.
std::string why_it_does_not_fit(const MemoryPlan& p, int stage, double limit_gib, int zero_ranks) {
  struct Part {
    double bytes;
    const char* what;
    const char* remedy;
  };
  const bool one = zero_ranks == 1;
  const char* more_ranks = "more data-parallel ranks for ZeRO to shard them over (with one, every zero_stage holds "
                           "the whole model), or more tp or pp";
  std::vector<Part> parts = {
      {double(p.activations), "activations", "recompute.mode=selective or full, or a smaller batch.micro_batch_size"},
      {double(p.master + p.optimizer), "master weights and Adam moments",
       one ? more_ranks : "a higher parallel.zero_stage (1 shards them)"},
      {double(p.grads + p.grads_working), "gradients", one ? more_ranks : "parallel.zero_stage=2 or 3"},
      {double(p.params + p.params_working), "parameters", one ? "more tp or pp" : "parallel.zero_stage=3, or more tp or pp"},
  };
  std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.bytes > b.bytes; });
  return format("needs %.3g GiB on stage %d > %g GiB; the most is %s (%.3g GiB): try %s", p.total() / kGiB, stage,
             limit_gib, parts[0].what, parts[0].bytes / kGiB, parts[0].remedy);
}

// Memory and time of one resolved layout.
LayoutPlan plan_layout(LayoutCandidate c, const Hardware& hw) {
  LayoutPlan lp;
  const ParamTable model = build_param_table(c.cfg.model);
  lp.memory = plan_stage_memory(c.cfg, model, planned_dtype(c.cfg));
  for (size_t s = 0; s < lp.memory.size(); s++)
    if (lp.memory[s].plan.total() > lp.peak().total()) lp.peak_stage = static_cast<int>(s);
  lp.fits = lp.peak().total() <= hw.gpu_memory_gib * kGiB;
  const auto& par = c.cfg.parallel;
  if (!lp.fits)
    lp.why_not = why_it_does_not_fit(lp.peak(), lp.peak_stage, hw.gpu_memory_gib, par.dp / par.dp_replicate * par.cp);
  lp.time = estimate_step_time(c.cfg, model, hw);
  lp.layout = std::move(c);
  return lp;
}

// "tensorwise on qkv, attn_out, mlp_up, mlp_down (gradients e5m2)", "delayed (amax history 16
// steps) on ..."; "" with precision.fp8 off.
std::string fp8_description(const PrecisionSection& p) {
  const Fp8Recipe r = fp8_recipe(p);
  if (!r.any()) return "";
  const std::string history = r.delayed ? " (amax history " + std::to_string(r.amax_history) + " steps)" : "";
  return p.fp8 + history + " on " + fp8_layer_list(r, ", ") + " (gradients " + fp8_format_name(r.grad) + ")";
}

// precision.fp8 on a GPU without FP8 tensor cores: nothing to plan, say which GPUs have them.
void check_fp8_gpu(const RunConfig& cfg, const Hardware& hw) {
  if (fp8_description(cfg.precision).empty() || hw.fp8_speedup > 0) return;
  std::string have;
  for (const GpuProfile& g : gpu_profiles())
    if (g.peak_fp8_tflops > 0) have += (have.empty() ? "" : ", ") + std::string(g.name);
  throw ConfigError("precision.fp8=" + cfg.precision.fp8 + " needs FP8 tensor cores, which the " + hw.gpu +
                    " does not have (its profile's FP8 peak is 0): plan for one that does (--gpu " + have +
                    ") or set precision.fp8=off");
}

// The order of the list: layouts that fit, then tp inside a node, then the faster.
bool better(const LayoutPlan& a, const LayoutPlan& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.time.tp_crosses_nodes != b.time.tp_crosses_nodes) return !a.time.tp_crosses_nodes;
  return a.time.step_s < b.time.step_s;
}

// The pipeline schedules a layout may run, as overrides of its config: first its own (no
// override), then what PlanSearch::pipeline_schedules adds.
std::vector<std::vector<std::string>> schedule_variants(const LayoutCandidate& c, const PlanSearch& search) {
  std::vector<std::vector<std::string>> out = {{}};
  const ParallelSection& par = c.cfg.parallel;
  const int layers = c.cfg.model.n_layers;
  if (!search.pipeline_schedules || par.pp < 2) return out;
  // The config's own pp_layers has one entry per stage of its own schedule: another schedule
  // gets its own split, as even as the blocks allow (the trainer's even split when it divides).
  auto schedule = [&](const char* name, int v) {
    std::vector<std::string> sets = {std::string("parallel.pp_schedule=") + name,
                                     "parallel.pp_virtual_stages=" + std::to_string(v)};
    if (layers % (par.pp * v) != 0 || !par.pp_layers.empty())
      sets.push_back("parallel.pp_layers=" + nlohmann::json(even_pp_layers(layers, par.pp * v)).dump());
    return sets;
  };
  const bool interleaved = par.pp_schedule == "interleaved";
  if (interleaved) out.push_back(schedule("1f1b", 1));
  for (int v = 2; v <= kMaxVirtualStages && par.pp * v <= layers; v++)
    if (!interleaved || v != par.pp_virtual_stages) out.push_back(schedule("interleaved", v));
  return out;
}

// One pipeline schedule of a layout, with its micro-batch size and (PlanSearch::micro_batches)
// that size halved down to 1: each planned, the best so far kept in `best`.
void plan_schedule_variant(const std::string& config_path, const LayoutCandidate& c,
                           const std::vector<std::string>& schedule, int gpus, const Hardware& hw,
                           const PlanSearch& search, std::optional<LayoutPlan>& best) {
  const LayoutCandidate base = schedule.empty() ? c : resolve_with(config_path, c, gpus, schedule);
  if (!base.valid()) return;  // e.g. interleaved with a micro-batch count not a multiple of pp
  const int own = base.cfg.batch.micro_batch_size;
  for (int mbs = own; mbs >= 1; mbs = search.micro_batches ? mbs / 2 : 0) {
    LayoutCandidate variant =
        mbs == own ? base : resolve_with(config_path, base, gpus, {"batch.micro_batch_size=" + std::to_string(mbs)});
    if (!variant.valid()) continue;
    LayoutPlan lp = plan_layout(std::move(variant), hw);
    if (!best || better(lp, *best)) best = std::move(lp);
  }
}

// The ZeRO stage, recompute mode and expert-parallel size a layout may run with, as overrides
// of its config: first its own (no override), then every combination PlanSearch adds.
std::vector<std::vector<std::string>> memory_variants(const LayoutCandidate& c, const PlanSearch& search) {
  std::vector<std::vector<std::string>> out = {{}};
  // Each dimension: the config's own value (no override) or one of `values`.
  auto vary = [&](const std::string& key, const std::vector<std::string>& values, const std::string& own) {
    std::vector<std::vector<std::string>> next;
    for (const std::vector<std::string>& sets : out) {
      next.push_back(sets);
      for (const std::string& v : values) {
        if (v == own) continue;
        next.push_back(sets);
        next.back().push_back(key + "=" + v);
      }
    }
    out = std::move(next);
  };
  const RunConfig& cfg = c.cfg;
  if (search.zero_stages) vary("parallel.zero_stage", {"0", "1", "2", "3"}, std::to_string(cfg.parallel.zero_stage));
  if (search.recompute) vary("recompute.mode", {"none", "selective", "full"}, cfg.recompute.mode);
  if (search.expert_parallel && cfg.model.moe.enabled()) {
    std::vector<std::string> eps;
    for (int ep = 1; ep <= cfg.parallel.dp; ep++)
      if (cfg.parallel.dp % ep == 0 && cfg.model.moe.n_experts % ep == 0) eps.push_back(std::to_string(ep));
    vary("parallel.ep", eps, std::to_string(cfg.parallel.ep));
  }
  return out;
}

// The best of a layout's variants: each of memory_variants, each pipeline schedule of
// schedule_variants, each with its micro-batch size and (PlanSearch::micro_batches) that size
// halved down to 1.
LayoutPlan best_variant(const std::string& config_path, const LayoutCandidate& c, int gpus, const Hardware& hw,
                        const PlanSearch& search) {
  std::optional<LayoutPlan> best;
  for (const std::vector<std::string>& memory : memory_variants(c, search)) {
    const LayoutCandidate own = memory.empty() ? c : resolve_with(config_path, c, gpus, memory);
    if (!own.valid()) continue;  // e.g. ZeRO-3 with FP8 rowwise, a rule the config keeps
    for (const std::vector<std::string>& schedule : schedule_variants(own, search))
      plan_schedule_variant(config_path, own, schedule, gpus, hw, search, best);
  }
  return std::move(*best);  // the first variant is c itself, valid
}

// The sched column: "-" without a pipeline, else the schedule ("intl4": interleaved, v = 4).
std::string schedule_label(const ParallelSection& par) {
  if (par.pp == 1) return "-";
  if (par.pp_schedule == "interleaved") return "intl" + std::to_string(par.pp_virtual_stages);
  return par.pp_schedule;
}

// The rcmp column: none, sel(ective) or full.
std::string recompute_label(const std::string& mode) { return mode == "selective" ? "sel" : mode; }

// A step's parts as the table shows them (communication: what is exposed, per axis); they sum
// to StepTime::step_s.
struct StepPart {
  const char* name;
  double s;
  bool comm;  // exposed communication of one axis
};
std::vector<StepPart> step_parts(const StepTime& t) {
  return {{"compute", t.compute_s, false}, {"recompute", t.recompute_s, false}, {"tp", t.tp_s, true},
          {"cp", t.cp_s, true},            {"pp", t.pp_s, true},                {"ep", t.ep_s, true},
          {"dp", t.dp_s, true},            {"bubble", t.bubble_s, false},       {"optimizer", t.optimizer_s, false}};
}

}  // namespace

std::string binding_constraint(const LayoutPlan& l) {
  if (!l.fits) return "memory: " + l.why_not;
  const auto parts = step_parts(l.time);
  const StepPart& top =
      *std::max_element(parts.begin(), parts.end(), [](const StepPart& a, const StepPart& b) { return a.s < b.s; });
  return format("%s%s (%.0f%% of the step)", top.name, top.comm ? " communication" : "", 100 * top.s / l.time.step_s);
}

std::string why_best(const Plan& plan) {
  if (plan.layouts.size() < 2) return "";
  const LayoutPlan &a = plan.layouts[0], &b = plan.layouts[1];
  const std::string head = "#1 " + a.layout.name() + " before #2 " + b.layout.name() + ": ";
  if (a.fits != b.fits) return head + "#2 does not fit (" + b.why_not + ")";
  if (a.time.tp_crosses_nodes != b.time.tp_crosses_nodes) return head + "#2's tp groups span nodes";
  // The two parts that differ most, by how much #1 saves (negative: where #1 pays more).
  std::vector<StepPart> diff = step_parts(b.time);
  const std::vector<StepPart> mine = step_parts(a.time);
  for (size_t i = 0; i < diff.size(); i++) diff[i].s -= mine[i].s;
  std::sort(diff.begin(), diff.end(), [](const StepPart& x, const StepPart& y) { return std::abs(x.s) > std::abs(y.s); });
  std::string out = head + format("%.1f ms (%.1f%%) less per step", 1e3 * (b.time.step_s - a.time.step_s),
                                  100 * (b.time.step_s - a.time.step_s) / b.time.step_s);
  for (size_t i = 0; i < 2; i++)
    out += format("%s %s %+.1f ms", i == 0 ? ", mostly" : ",", diff[i].name, -1e3 * diff[i].s);
  return out + " (#1 minus #2); #1's limit: " + binding_constraint(a);
}

std::string format_plan_json(const Plan& plan, const Hardware& hw, const std::string& config_path) {
  using nlohmann::json;
  json layouts = json::array();
  for (const LayoutPlan& l : plan.layouts) {
    const ParallelSection& par = l.layout.cfg.parallel;
    const MemoryPlan& p = l.peak();
    json ms = json::object(), exposed = json::object();
    for (const StepPart& part : step_parts(l.time)) (part.comm ? exposed : ms)[part.name] = 1e3 * part.s;
    ms["exposed_comm"] = exposed;
    ms["hidden_comm"] = 1e3 * l.time.hidden_s;
    ms["step"] = 1e3 * l.time.step_s;
    layouts.push_back({
        {"layout", l.layout.name()},
        {"dp", par.dp}, {"tp", par.tp}, {"pp", par.pp}, {"cp", par.cp},
        {"pp_schedule", par.pp_schedule}, {"pp_virtual_stages", par.pp_virtual_stages}, {"pp_layers", par.pp_layers},
        {"micro_batch_size", l.layout.cfg.batch.micro_batch_size},
        {"zero_stage", par.zero_stage}, {"recompute", l.layout.cfg.recompute.mode}, {"ep", par.ep},
        {"grad_accum_steps", l.layout.cfg.batch.grad_accum_steps},
        {"memory_gib", {{"params", (p.params + p.params_working) / kGiB}, {"grads", (p.grads + p.grads_working) / kGiB},
                        {"optimizer", (p.master + p.optimizer) / kGiB}, {"activations", p.activations / kGiB},
                        {"total", p.total() / kGiB}, {"stage", l.peak_stage}}},
        {"fits", l.fits},
        {"time_ms", ms},
        {"fp8_casts_ms", 1e3 * l.time.fp8_casts_s},  // of compute and recompute
        {"tokens_per_s", l.time.tokens_per_s},
        {"mfu", l.time.mfu},
        {"links", l.time.links},
        {"binding", binding_constraint(l)},
        {"overrides", l.layout.sets},
    });
  }
  json invalid = json::array();
  for (const LayoutCandidate& c : plan.invalid) invalid.push_back({{"layout", c.name()}, {"rule", c.invalid}});
  const std::string fp8 = plan.layouts.empty() ? "" : fp8_description(plan.example.precision);
  const json out = {{"config", config_path}, {"gpus", plan.gpus},
                    {"gpu", hw.gpu},         {"fp8", fp8.empty() ? "off" : fp8},
                    {"why_best", why_best(plan)},
                    {"layouts", layouts},    {"invalid", invalid}};
  return out.dump(2);
}

Plan make_plan(const std::string& config_path, const std::vector<std::string>& overrides, int gpus,
               const Hardware& hardware, const PlanSearch& search) {
  Hardware hw = hardware;
  if (hw.gpus_per_node < 1) throw ConfigError("plan --gpus-per-node " + std::to_string(hw.gpus_per_node) + " must be >= 1");
  if (!(hw.gpu_memory_gib > 0 && hw.nvlink_gbps > 0 && hw.network_gbps > 0 && hw.peak_tflops > 0))
    throw ConfigError("plan: --gpu-memory-gib, --nvlink-gbps, --network-gbps and --peak-tflops must be > 0");
  if (!(hw.fp8_speedup >= 0)) throw ConfigError("plan: the GPU's FP8 speedup over bf16 must be >= 0 (0: no FP8)");
  if (!(hw.mfu >= 0 && hw.mfu <= 1))
    throw ConfigError("plan --mfu " + std::to_string(hw.mfu) + " must be in (0, 1] (or 0: measured kernel speeds)");
  if (hw.mfu == 0) hw.kernels = planning_kernels(hw);  // once, not per layout
  Plan plan;
  plan.gpus = gpus;
  std::vector<LayoutCandidate> candidates = enumerate_layouts(config_path, overrides, gpus);
  if (!search.layout.empty()) {
    const auto named = [&](const LayoutCandidate& c) { return c.name() == search.layout; };
    if (std::none_of(candidates.begin(), candidates.end(), named))
      throw ConfigError("plan --layout '" + search.layout + "' is not a layout of " + std::to_string(gpus) +
                        " GPUs: write it as dpA tpB ppC cpD with A*B*C*D = " + std::to_string(gpus) + ", e.g. '" +
                        candidates.front().name() + "'");
    std::erase_if(candidates, [&](const LayoutCandidate& c) { return !named(c); });
  }
  for (LayoutCandidate& c : candidates) {
    if (!c.valid()) {
      plan.invalid.push_back(std::move(c));
      continue;
    }
    check_fp8_gpu(c.cfg, hw);
    plan.layouts.push_back(best_variant(config_path, c, gpus, hw, search));
  }
  std::stable_sort(plan.layouts.begin(), plan.layouts.end(), better);
  if (!plan.layouts.empty()) plan.example = plan.layouts.front().layout.cfg;
  return plan;
}

std::string format_plan(const Plan& plan, const Hardware& hw, const std::string& config_path) {
  std::string out;
  const int nodes = (plan.gpus + hw.gpus_per_node - 1) / hw.gpus_per_node;
  const size_t combos = plan.layouts.size() + plan.invalid.size();
  if (plan.layouts.empty()) {
    out += format("plan      | %s on %d GPUs: none of the %zu layouts passes the config rules:\n", config_path.c_str(),
               plan.gpus, combos);
  } else {
    const RunConfig& cfg = plan.example;
    const ParamTable model = build_param_table(cfg.model);
    const double per_token = flops_per_token(model, cfg.model, cfg.batch.seq_len, cfg.logging.flops_formula);
    const std::string fp8 = fp8_description(cfg.precision);
    out += format("plan      | %s on %d GPUs, %d per node (%d node%s): %.2fM parameters, %lld tokens per step of %d-token "
               "sequences, ZeRO-%d, recompute %s, %s%s\n",
               config_path.c_str(), plan.gpus, std::min(plan.gpus, hw.gpus_per_node), nodes, nodes == 1 ? "" : "s",
               model.total_numel() / 1e6, static_cast<long long>(cfg.batch.global_batch_tokens), cfg.batch.seq_len,
               cfg.parallel.zero_stage, cfg.recompute.mode.c_str(), planned_dtype(cfg) == DType::f32 ? "fp32" : "bf16",
               fp8.empty() ? "" : ", FP8 (see fp8 below)");
    out += format("compute   | %s = %.3g FLOPs per token (MFU against %.1f TFLOP/s per GPU); ",
                  flops_formula_description(model, cfg.model, cfg.logging.flops_formula).c_str(), per_token,
                  hw.peak_tflops);
    if (hw.mfu > 0) {
      out += format("timed as a flat MFU %.2f of the peak (--mfu)\n", hw.mfu);
    } else {
      const std::shared_ptr<const KernelTable> k = planning_kernels(hw);
      out += format("timed kernel by kernel from %zu measured kernels of %s (%s); shapes not measured: %.0f%%/%.0f%% "
                    "of its %.0f TFLOP/s matmul ceiling forward/backward, %.0f%% of its %.0f GB/s copy ceiling\n",
                    k->rows.size(), k->device.c_str(), k->source.c_str(), 100 * k->matmul_efficiency(false),
                    100 * k->matmul_efficiency(true), k->flop_ceiling_tflops, 100 * k->memory_efficiency(),
                    k->bandwidth_ceiling_gbps);
    }
    out += format("gpu       | %s: %.1f TFLOP/s dense bf16, %g GiB, HBM %.0f GB/s\n", hw.gpu.c_str(), hw.peak_tflops,
                  hw.gpu_memory_gib, hw.hbm_gbps);
    if (!fp8.empty() && hw.mfu > 0)
      out += "fp8       | " + fp8 + ": not in the flat --mfu model (all compute at its share of the bf16 peak)\n";
    else if (!fp8.empty())
      out += format("fp8       | %s: their products at the kernel table's FP8 rows where it has them, else bf16's time "
                    "/ %.2f (the FP8 over the bf16 peak; not calibrated on measured FP8 kernels), plus their casts' "
                    "HBM traffic (#1: %.1f ms a step); the LM head, attention and routed experts stay bf16\n",
                    fp8.c_str(), hw.fp8_speedup, 1e3 * plan.layouts.front().time.fp8_casts_s);
    out += format("links     | NVLink %.0f GB/s inside a node, network %.0f GB/s between nodes (per GPU, one way); %s\n",
                  hw.nvlink_gbps, hw.network_gbps, describe(hw.overlap).c_str());
    out += format("memory    | %g GiB per GPU, of which picotrain's own buffers (below) must leave room for the CUDA "
               "context and library workspaces (about 1-2 GiB)\n\n",
               hw.gpu_memory_gib);
    const int fitting = static_cast<int>(std::count_if(plan.layouts.begin(), plan.layouts.end(),
                                                       [](const LayoutPlan& l) { return l.fits; }));
    out += format("%zu valid layouts of %zu (dp*tp*pp*cp = %d), %d fit; best first. Memory per GPU in GiB on the largest "
               "stage (opt: master weights + Adam moments; acts: activations); predicted milliseconds per step; sched: the "
               "pipeline schedule (intlN: interleaved over N virtual stages); zero, rcmp, ep: the ZeRO stage, recompute mode and "
               "expert-parallel size:\n",
               plan.layouts.size(), combos, plan.gpus, fitting);
    out += format("%3s  %-16s %6s %5s %5s %4s %4s %3s | %6s %6s %6s %6s %6s | %8s %6s %6s %6s %6s %8s | %9s %6s | %s\n", "#",
                  "layout", "sched", "micro", "accum", "zero", "rcmp", "ep", "params", "grads", "opt", "acts", "total",
                  "compute", "recomp", "comm", "bubble", "optim", "step", "tokens/s", "MFU", "fits; links");
    int n = 0;
    for (const LayoutPlan& l : plan.layouts) {
      const MemoryPlan& p = l.peak();
      const StepTime& t = l.time;
      const RunConfig& cfg = l.layout.cfg;
      out += format("%3d  %-16s %6s %5d %5d %4d %4s %3d | %6.2f %6.2f %6.2f %6.2f %6.2f | %8.1f %6.1f %6.1f %6.1f %6.1f %8.1f | "
                    "%9.0f %5.1f%% | %s%s%s\n",
                    ++n, l.layout.name().c_str(), schedule_label(cfg.parallel).c_str(), cfg.batch.micro_batch_size,
                    cfg.batch.grad_accum_steps, cfg.parallel.zero_stage, recompute_label(cfg.recompute.mode).c_str(),
                    cfg.parallel.ep,
                    (p.params + p.params_working) / kGiB, (p.grads + p.grads_working) / kGiB,
                    (p.master + p.optimizer) / kGiB, p.activations / kGiB, p.total() / kGiB, t.compute_s * 1e3,
                    t.recompute_s * 1e3, t.comm_s() * 1e3, t.bubble_s * 1e3, t.optimizer_s * 1e3, t.step_s * 1e3,
                    t.tokens_per_s, 100 * t.mfu, l.fits ? "yes" : "NO", t.links.empty() ? "" : "; ", t.links.c_str());
    }
    if (plan.layouts.size() > 1) out += "why       | " + why_best(plan) + "\n";
    bool header = false;
    for (const LayoutPlan& l : plan.layouts) {
      if (l.fits) continue;
      if (!header) out += "\ndo not fit:\n";
      header = true;
      out += "  " + l.layout.name() + ": " + l.why_not + "\n";
    }
  }
  if (!plan.invalid.empty()) out += plan.layouts.empty() ? "" : "\nnot valid (the config rule each breaks):\n";
  for (const LayoutCandidate& c : plan.invalid) out += "  " + c.name() + ": " + c.invalid + "\n";
  return out;
}

}  // namespace pt
