#include "core/dist/comm_backend.h"

namespace pt {

const char* comm_backend_name(CommBackend b) {
  switch (b) {
    case CommBackend::local: return "local";
    case CommBackend::mpi: return "mpi";
    case CommBackend::nccl: return "nccl";
  }
  return "?";
}

CommBackendChoice choose_comm_backend(const CommBackendFacts& f) {
  const std::string key = "parallel.comm_backend=" + f.requested;
  if (f.world_size == 1) return {CommBackend::local, false, "one rank: nothing to communicate"};
  if (f.device == Device::cpu) {
    if (f.requested == "nccl")
      throw ConfigError(key + ": NCCL moves GPU memory, and this run uses the cpu backend (use --device cuda)");
    return {CommBackend::mpi, false, "MPI on host memory (the cpu backend)"};
  }
  if (f.requested == "mpi")
    return {CommBackend::mpi, true, key + ": MPI, device buffers staged through pinned host memory"};
  // Why NCCL cannot run here, or "" when it can.
  std::string blocker;
  if (!f.nccl_loaded)
    blocker = f.nccl_detail;
  else if (f.max_ranks_per_gpu > 1)
    blocker = std::to_string(f.max_ranks_per_gpu) +
              " ranks share one GPU and NCCL needs a GPU per rank (start at most as many ranks per node as it has GPUs)";
  if (blocker.empty())
    return {CommBackend::nccl, false, "NCCL " + f.nccl_detail + ", one GPU per rank"};
  if (f.requested == "nccl") throw ConfigError(key + ": NCCL cannot run here: " + blocker);
  return {CommBackend::mpi, true, "MPI with device buffers staged through pinned host memory, not NCCL: " + blocker};
}

}  // namespace pt
