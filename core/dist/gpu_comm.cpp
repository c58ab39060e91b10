#include "core/dist/gpu_comm.h"

#include <unistd.h>

#include <climits>

#include "core/dist/local_comm.h"

#ifdef PICOTRAIN_WITH_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/cuda_device.h"
#include "cuda/host_staging_cuda.h"
#include "cuda/nccl_api.h"
#include "cuda/nccl_comm.h"
#endif

namespace pt {

int gpu_for_local_rank(int local_rank, int visible_devices) {
  check(visible_devices > 0, "gpu_for_local_rank: no visible device");
  return local_rank % visible_devices;
}

void use_gpu_of_local_rank(const World& world) {
#ifdef PICOTRAIN_WITH_CUDA
  const int devices = cuda_device_count();
  if (devices > 0) cuda_use_device(gpu_for_local_rank(world.local_rank, devices));
#endif
}

std::shared_ptr<HostStaging> make_host_staging(Ops& ops) {
  if (ops.device() == Device::cpu) return nullptr;
#ifdef PICOTRAIN_WITH_CUDA
  return make_cuda_host_staging(ops);
#else
  throw RuntimeError(std::string("no staging for the ") + device_name(ops.device()) + " backend in this build");
#endif
}

NcclProbe probe_nccl() {
#ifdef PICOTRAIN_WITH_CUDA
  if (const nccl::Api* api = nccl::try_load()) return {true, nccl::version_string(api->version)};
  return {false, nccl::load_error()};
#else
  return {false, "this picotrain was built without CUDA"};
#endif
}

std::string gpu_identity() {
#ifdef PICOTRAIN_WITH_CUDA
  if (cuda_device_count() == 0) return "";
  char host[HOST_NAME_MAX + 1] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "/" + cuda_device_uuid();
#else
  return "";
#endif
}

GroupCommMaker nccl_group_maker(Comm& host_world, Ops& ops) {
#ifdef PICOTRAIN_WITH_CUDA
  std::shared_ptr<NcclComm> world = NcclComm::make_world(host_world, ops);
  // A rank alone in its group (tp 1, the embedding group of a middle stage, ...) moves nothing:
  // it takes part in the split without getting an NCCL communicator, whose channels and memory
  // would go unused.
  return [world, &ops](const std::vector<int>& members) -> std::unique_ptr<Comm> {
    if (members.size() > 1) return world->split(members);
    world->split_out();
    return std::make_unique<LocalComm>(members.at(0), ops);
  };
#else
  throw RuntimeError("NCCL needs a picotrain built with CUDA");
#endif
}

std::string nccl_async_error() {
#ifdef PICOTRAIN_WITH_CUDA
  return NcclComm::async_error();
#else
  return "";
#endif
}

}  // namespace pt
