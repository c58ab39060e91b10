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

std::unique_ptr<Ops> make_ops(Device device, DType compute_dtype) {
  if (device == Device::cpu) {
    if (compute_dtype != DType::f32)
      throw ConfigError(std::string("the CPU backend computes in fp32, not ") + dtype_name(compute_dtype) +
                        " (use precision.compute_dtype=fp32 or auto)");
    return std::make_unique<CpuOps>();
  }
#ifdef PICOTRAIN_WITH_CUDA
  if (!cuda_available())
    throw ConfigError("device=cuda: no CUDA device is visible (" + cuda_status_message() + "); use --device cpu");
  if (compute_dtype != DType::f32 && compute_dtype != DType::bf16)
    throw ConfigError(std::string("the CUDA backend computes in fp32 or bf16, not ") + dtype_name(compute_dtype));
  return make_cuda_ops(compute_dtype);
#else
  throw ConfigError("device=cuda: this picotrain was built without CUDA (configure with -DPICOTRAIN_CUDA=ON)");
#endif
}

std::unique_ptr<Ops> make_ops(Device device) {
  return make_ops(device, device == Device::cpu ? DType::f32 : DType::bf16);
}

}  // namespace pt
