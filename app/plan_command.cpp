#include "app/plan_command.h"

#include <memory>

#include "app/number_flags.h"
#include "core/common/console.h"
#include "core/plan/hardware_profiles.h"

namespace pt::app {

namespace {

// The numbers of --gpu's profile a flag may override: add_plan_command adds them, run_plan lays
// the ones given over the profile.
struct HardwareFlag {
  const char* flag;
  double pt::Hardware::*field;
  const char* help;
};
const HardwareFlag kHardwareFlags[] = {
    {"--gpu-memory-gib", &pt::Hardware::gpu_memory_gib,
     "Memory of one GPU in GiB; a layout whose largest stage needs more does not fit (default: --gpu's; h100-sxm: "
     "80)"},
    {"--nvlink-gbps", &pt::Hardware::nvlink_gbps,
     "Bandwidth inside a node, GB/s (gigabytes) per GPU, one way (default: --gpu's; h100-sxm, NVLink 4: 450)"},
    {"--network-gbps", &pt::Hardware::network_gbps,
     "Bandwidth between nodes, GB/s per GPU, one way (default: --gpu's; h100-sxm, one 400 Gb/s InfiniBand NIC per "
     "GPU: 50)"},
    {"--peak-tflops", &pt::Hardware::peak_tflops,
     "Dense bf16 peak of one GPU in TFLOP/s, what MFU is measured against (default: --gpu's; h100-sxm: 989.4)"},
    {"--hbm-gbps", &pt::Hardware::hbm_gbps,
     "Memory bandwidth of one GPU, GB/s: scales the memory-bound kernels of the H100 table (default: --gpu's; "
     "h100-sxm: 3350)"},
};

}  // namespace

void add_plan_command(CLI::App& app, PlanArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "List the layouts (dp, tp, pp, cp) a config can run on N GPUs, with memory per GPU and a predicted step "
              "time, best first; runs nothing. The defaults describe H100 SXM nodes (--gpu h100-sxm)");
  a.cmd = cmd;
  cmd->add_option("--config,-c", a.config, "Run config (JSON), as for train")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set,-s", a.overrides,
                  "Override one config key, as for train (e.g. --set parallel.zero_stage=3 --set "
                  "recompute.mode=selective); parallel.dp/tp/pp/cp are set by the plan for each layout");
  cmd->add_option("--gpus,-n", a.gpus, "GPUs (ranks) in all: every dp*tp*pp*cp = N is considered")
      ->required()
      ->check(pt::cli::whole_at_least(1));
  cmd->add_option("--gpu", a.gpu,
                  "The GPU: its datasheet's peak, memory, HBM, NVLink and network bandwidth (core/plan/"
                  "hardware_profiles.cpp cites them); the flags below override any of its numbers. One of " +
                      pt::gpu_profile_names())
      ->capture_default_str();
  cmd->add_option("--gpus-per-node", a.hw.gpus_per_node,
                  "GPUs per node: a group whose ranks span nodes runs at --network-gbps (ranks fill nodes in order, "
                  "placed on the grid by parallel.order); layouts with tp inside a node are listed first")
      ->check(pt::cli::whole_at_least(1))
      ->capture_default_str();
  for (const HardwareFlag& f : kHardwareFlags)
    cmd->add_option(f.flag, a.hw.*f.field, f.help)->check(pt::cli::above(0))->capture_default_str();
  cmd->add_option("--kernels", a.kernels,
                  "Measured kernel speeds of the GPU to plan for: the JSON that bench/kernel_bench --json writes "
                  "on it. Default: our H100's (bench/runs/2026-11-26-h100-bench.md, compiled in), scaled by --peak-tflops "
                  "and --hbm-gbps; shapes it lacks follow the fallback curve of docs/parallel.md")
      ->check(CLI::ExistingFile);
  cmd->add_option("--attention", a.attention,
                  "Plan another library's attention kernels: the JSON bench/attention_sdpa.py writes (PyTorch SDPA, "
                  "the faster of its flash and cuDNN back ends at each shape), in place of the kernel table's; rates "
                  "scaled from the measuring GPU's peak to --peak-tflops. For systems built on FlashAttention or "
                  "cuDNN, e.g. bench/runs/2026-11-27b-h200-attention_sdpa.json")
      ->check(CLI::ExistingFile);
  cmd->add_option("--mfu", a.hw.mfu,
                  "Instead of the measured kernel speeds, time all compute as FLOPs at this flat share of the peak, "
                  "in (0, 1] (the planner's old model; default: the measured kernels)")
      ->check(pt::cli::above_up_to(0.0, 1.0))
      ->excludes("--kernels")
      ->excludes("--attention");
  cmd->add_flag("--search-micro-batch", a.search.micro_batches,
                "For each layout also try batch.micro_batch_size halved down to 1 (more micro-batches: a smaller "
                "pipeline bubble and less activation memory, smaller kernels) and keep the fastest that fits; the "
                "micro column says which");
  cmd->add_flag("--search-pipeline", a.search.pipeline_schedules,
                "For each layout with pp > 1 also try the interleaved schedule with 2 to 8 virtual stages (blocks "
                "split as evenly as they go, the first and last stages lighter) and, for an interleaved config, "
                "1F1B, and keep the fastest that fits; the sched column says which");
  cmd->add_flag("--search-zero", a.search.zero_stages,
                "For each layout also try every parallel.zero_stage (0-3) and keep the fastest that fits; the zero "
                "column says which");
  cmd->add_flag("--search-recompute", a.search.recompute,
                "For each layout also try every recompute.mode (none, selective, full) and keep the fastest that fits; "
                "the rcmp column says which");
  cmd->add_flag("--search-ep", a.search.expert_parallel,
                "For a mixture of experts, for each layout also try every parallel.ep that divides both dp and "
                "moe.n_experts and keep the fastest that fits; the ep column says which");
  cmd->add_flag("--search-all", a.search_all,
                "All of --search-micro-batch, --search-pipeline, --search-zero, --search-recompute and --search-ep "
                "(their variants multiply: slower on large GPU counts)");
  cmd->add_option("--layout", a.search.layout,
                  "Plan only this layout, written as the table writes it, e.g. \"dp128 tp8 pp16 cp1\" (its breakdown, "
                  "or why it is not valid); default: every dp*tp*pp*cp = N");
  cmd->add_option("--overlap", a.overlap,
                  "What communication runs beside compute in the system planned for, a comma-separated list of dp "
                  "(gradient buckets during the backward), zero (ZeRO's parameter gathers, and ZeRO-2/3's per-micro-batch "
                  "reduce-scatters during the backward), tp, cp and pp "
                  "(asynchronous sends), or none. Default picotrain: what picotrain's trainer overlaps (dp). "
                  "Another system's list plans its published runs (e.g. Megatron-LM's --overlap-grad-reduce, "
                  "--overlap-param-gather and tp comm overlap: dp,zero,tp,pp)")
      ->capture_default_str();
  cmd->add_flag("--json", a.json,
                "Print the plan as JSON for scripts: each layout's schedule, memory (GiB), step breakdown (ms: compute, "
                "recompute, exposed communication per axis, bubble, optimizer), MFU, binding constraint, and the "
                "invalid layouts with the rule each breaks");
}

int run_plan(const PlanArgs& a) {
  pt::Hardware hw = pt::hardware_of(pt::gpu_profile(a.gpu), a.hw.gpus_per_node);
  // A flag given on the command line overrides the profile's number.
  for (const HardwareFlag& f : kHardwareFlags)
    if (a.cmd->count(f.flag) > 0) hw.*f.field = a.hw.*f.field;
  hw.mfu = a.hw.mfu;
  hw.overlap = pt::parse_overlap(a.overlap);
  if (!a.kernels.empty()) hw.kernels = std::make_shared<pt::KernelTable>(pt::KernelTable::from_file(a.kernels));
  if (!a.attention.empty())
    hw.kernels = std::make_shared<pt::KernelTable>(
        pt::planning_kernels(hw)->with_attention_of(a.attention, hw.peak_tflops));
  pt::PlanSearch search = a.search;
  if (a.search_all)
    search.micro_batches = search.pipeline_schedules = search.zero_stages = search.recompute =
        search.expert_parallel = true;
  const pt::Plan plan = pt::make_plan(a.config, a.overrides, a.gpus, hw, search);
  pt::print_line(pt::Stream::out, a.json ? pt::format_plan_json(plan, hw, a.config) : pt::format_plan(plan, hw, a.config));
  return 0;
}

}  // namespace pt::app
