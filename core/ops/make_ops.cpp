// The backend factory: the one place that knows which backends are built in.
#include "core/cpu/cpu_ops.h"
#include "core/ops/ops.h"

#ifdef PICOTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "cuda/cuda_backend.h"

static_assert(pt::kCudaSuccess == cudaSuccess && pt::kCudaErrorNoDevice == cudaErrorNoDevice &&
              pt::kCudaErrorInsufficientDriver == cudaErrorInsufficientDriver);
#endif

namespace pt {

CudaPresence classify_cuda_presence(int error, const std::string& error_text, int device_count,
                                    bool driver_library_loads) {
  using State = CudaPresence::State;
  const std::string what = error_text + " (cudaError " + std::to_string(error) + ")";
  if (error == kCudaSuccess)
    return device_count > 0 ? CudaPresence{State::present, std::to_string(device_count) + " CUDA device(s)"}
                            : CudaPresence{State::absent, "the CUDA runtime counts no device"};
  if (error == kCudaErrorNoDevice) return {State::absent, "the driver sees no CUDA device: " + what};
  // The runtime reports a missing driver as one too old for it; only a driver library that does
  // not load tells "no driver here" from a driver/runtime mismatch on a GPU machine.
  if (error == kCudaErrorInsufficientDriver && !driver_library_loads)
    return {State::absent, "no NVIDIA driver is installed (libcuda.so.1 does not load): " + what};
  return {State::broken, "cudaGetDeviceCount failed: " + what};
}

CudaPresence cuda_presence() {
#ifdef PICOTRAIN_WITH_CUDA
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();  // clear the runtime's last-error slot so it is not reported later
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);  // the name the runtime loads
  if (driver) dlclose(driver);
  return classify_cuda_presence(err, std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err), n,
                                driver != nullptr);
#else
  return {CudaPresence::State::absent, "this picotrain was built without CUDA"};
#endif
}

bool cuda_available() { return cuda_presence().state == CudaPresence::State::present; }

Device default_device(const CudaPresence& gpu) {
  if (gpu.state == CudaPresence::State::broken)
    throw ConfigError("this machine has CUDA but cannot use it (" + gpu.detail +
                      "): fix the driver or the CUDA install, or pass --device cpu to train on the CPU");
  return gpu.state == CudaPresence::State::present ? Device::cuda : Device::cpu;
}

std::unique_ptr<Ops> make_ops(Device device, DType compute_dtype) {
  if (device == Device::cpu) {
    if (compute_dtype != DType::f32)
      throw ConfigError(std::string("the CPU backend computes in fp32, not ") + dtype_name(compute_dtype) +
                        " (use precision.compute_dtype=fp32 or auto)");
    return std::make_unique<CpuOps>();
  }
#ifdef PICOTRAIN_WITH_CUDA
  if (const CudaPresence gpu = cuda_presence(); gpu.state != CudaPresence::State::present)
    throw ConfigError("device=cuda: no usable CUDA device (" + gpu.detail + "); use --device cpu");
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
