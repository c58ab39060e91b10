#include "core/train/cuda_graphs.h"

#include "core/common/format.h"

namespace pt {

std::string cuda_graphs_blocker(const RunConfig& cfg, Device device) {
  if (device != Device::cuda) return std::string("the ") + device_name(device) + " backend runs each op as it is called";
  const ParallelSection& p = cfg.parallel;
  const auto op_by_op = [](const std::string& why) { return why + ", which a recording cannot hold: it runs op by op"; };
  if (p.tp > 1 || p.cp > 1 || p.ep > 1)
    return op_by_op(format("tp=%d cp=%d ep=%d talk to other ranks inside forward and backward", p.tp, p.cp, p.ep));
  const int shards = p.dp / p.dp_replicate * p.cp;
  if (p.zero_stage >= 2 && shards > 1)
    return op_by_op(format("ZeRO-%d over %d ranks reduces%s each layer in every micro-step", p.zero_stage, shards,
                           p.zero_stage == 3 ? " and gathers" : ""));
  if (p.dp > 1 && cfg.batch.grad_accum_steps == 1)
    return op_by_op(format("dp=%d with one micro-batch a step starts the gradient reductions inside its backward", p.dp));
  if (cfg.precision.fp8 == "delayed")
    return op_by_op("precision.fp8=delayed advances its amax history each step through host state");
  return "";
}

}  // namespace pt
