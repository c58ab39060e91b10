// The backend factory: the one place that knows which backends are built in.
#include "core/cpu/cpu_ops.h"
#include "core/ops/ops.h"

#ifdef PICOTRAIN_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace pt {

bool cuda_available() {
#ifdef PICOTRAIN_WITH_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Ops> make_ops(Device device) {
  if (device == Device::cpu) return std::make_unique<CpuOps>();
#ifdef PICOTRAIN_WITH_CUDA
  if (!cuda_available())
    throw ConfigError("device=cuda: no CUDA device is visible (" + cuda_status_message() + "); use --device cpu");
  return make_cuda_ops();
#else
  throw ConfigError("device=cuda: this picotrain was built without CUDA (configure with -DPICOTRAIN_CUDA=ON)");
#endif
}

}  // namespace pt
