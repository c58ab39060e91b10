// What core/dist needs from the CUDA backend to communicate: the GPU each rank uses, staging for
// MpiComm, and NCCL. The one place in core/dist that knows whether CUDA is built in; in a build
// without it every function answers "no GPU" (and the NCCL ones are never reached).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dist/comm.h"
#include "core/dist/host_staging.h"
#include "core/dist/world.h"
#include "core/ops/ops.h"

namespace pt {

// The GPU of the rank with this local rank: local ranks take the visible devices in turn, so N
// ranks on a node with N GPUs get one each, and more ranks than GPUs share them round-robin.
int gpu_for_local_rank(int local_rank, int visible_devices);
// Makes this rank's GPU (gpu_for_local_rank) the current device, when this build has CUDA and a
// GPU is visible; otherwise does nothing. Call before the CUDA Ops are made.
void use_gpu_of_local_rank(const World& world);

// How MpiComm moves `ops`'s tensors: nullptr for host memory (the cpu backend).
std::shared_ptr<HostStaging> make_host_staging(Ops& ops);

// Whether NCCL loads in this process: its version ("2.21.5"), or the loader's one-line reason.
struct NcclProbe {
  bool loaded = false;
  std::string detail;
};
NcclProbe probe_nccl();

// Names the GPU this process uses so that ranks can count how many share one: the host name and
// the device's UUID. "" without a GPU.
std::string gpu_identity();

// Makes the communicator of one group (members: world ranks, in group order). Collective over
// the world, like make_group_comm.
using GroupCommMaker = std::function<std::unique_ptr<Comm>(const std::vector<int>& members)>;
// NCCL communicators: bootstraps the NCCL world over `host_world` (collective), and returns a
// maker that splits it; the maker keeps the NCCL world alive. Throws without CUDA.
GroupCommMaker nccl_group_maker(Comm& host_world, Ops& ops);

// The first asynchronous error of this process's NCCL communicators (NcclComm::async_error),
// "" when there is none, no communicator, or no CUDA in this build. Thread-safe.
std::string nccl_async_error();

}  // namespace pt
