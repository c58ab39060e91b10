// `picotrain plan`: without running anything, the layouts a config can use on N GPUs, each with
// its memory per GPU (core/plan/stage_memory.h, the trainer's own accounting) and a predicted
// step time (core/plan/step_time.h), best first, and why the others do not fit or are not valid.
#pragma once
#include <string>
#include <vector>

#include "core/plan/layouts.h"
#include "core/plan/stage_memory.h"
#include "core/plan/step_time.h"

namespace pt {

struct LayoutPlan {
  LayoutCandidate layout;
  std::vector<StageMemory> memory;  // one per pipeline stage
  int peak_stage = 0;               // the stage that needs the most
  bool fits = true;                 // the peak stage fits in Hardware::gpu_memory_gib
  std::string why_not;              // when it does not: what is too big and what would shrink it
  StepTime time;
  const MemoryPlan& peak() const { return memory[static_cast<size_t>(peak_stage)].plan; }
};

struct Plan {
  int gpus = 0;
  // The valid layouts, best first: those that fit, then tensor parallel inside a node, then by
  // predicted step time.
  std::vector<LayoutPlan> layouts;
  std::vector<LayoutCandidate> invalid;  // divisor combinations that break a config rule
  RunConfig example;                      // the first valid layout's config (for the header)
};

// What the plan may change besides dp/tp/pp/cp.
struct PlanSearch {
  // Try batch.micro_batch_size halved down to 1 for each layout (more micro-batches: a smaller
  // pipeline bubble, less activation memory, smaller kernels) and keep the fastest that fits.
  bool micro_batches = false;
  // With pp > 1, also try the interleaved schedule over v = 2..kMaxVirtualStages virtual stages
  // (each of at least one block; an uneven split from even_pp_layers when v*pp does not divide
  // n_layers) and, for an interleaved config, 1F1B; keep the fastest that fits.
  bool pipeline_schedules = false;
  // Also try every parallel.zero_stage (0-3), every recompute.mode (none, selective, full) and,
  // for a mixture of experts, every parallel.ep dividing both dp and moe.n_experts; keep the
  // fastest variant that fits. Each multiplies the variants a layout is planned in.
  bool zero_stages = false;
  bool recompute = false;
  bool expert_parallel = false;
  // Plan only this layout ("dp128 tp8 pp16 cp1", LayoutCandidate::name); "": every layout.
  std::string layout;
};

// Beyond 8 chunks per rank each chunk's sends and kernels are too small to pay (Megatron-LM's
// published runs use v <= 8), and every v is another simulated schedule per layout.
constexpr int kMaxVirtualStages = 8;

// Throws ConfigError for a bad config or options (see enumerate_layouts).
Plan make_plan(const std::string& config_path, const std::vector<std::string>& overrides, int gpus, const Hardware& hw,
               const PlanSearch& search = {});

// The text `picotrain plan` prints.
std::string format_plan(const Plan& plan, const Hardware& hw, const std::string& config_path);

// `picotrain plan --json`: every valid layout, best first, with its schedule, memory (GiB), step
// breakdown (ms: compute, recompute, exposed communication per axis, bubble, optimizer), the
// binding constraint, and the invalid layouts with the rule each breaks.
std::string format_plan_json(const Plan& plan, const Hardware& hw, const std::string& config_path);

// What limits a layout: memory when it does not fit, else the largest part of its step.
std::string binding_constraint(const LayoutPlan& l);

// One line on why the first layout beats the second: the parts of the step that differ most.
std::string why_best(const Plan& plan);

}  // namespace pt
