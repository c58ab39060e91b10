#include "core/train/cuda_graphs.h"

#include "core/common/format.h"

namespace pt {

std::string cuda_graphs_blocker(const RunConfig& cfg, Device device) {
  if (device != Device::cuda) return std::string("the ") + device_name(device) + " backend runs each op as it is called";
  const ParallelSection& p = cfg.parallel;
  const int gpus = p.dp * p.tp * p.pp * p.cp;
  if (gpus > 1)
    return format("the layout spans %d GPUs (dp=%d tp=%d pp=%d cp=%d): its collectives inside forward and backward "
                  "and its pipeline messages are not recorded, so it runs op by op",
                  gpus, p.dp, p.tp, p.pp, p.cp);
  if (cfg.precision.fp8 == "delayed")
    return "precision.fp8=delayed: the amax history advances each step through host state, so it runs op by op";
  return "";
}

}  // namespace pt
