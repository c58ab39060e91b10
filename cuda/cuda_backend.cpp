// The CUDA backend's entry points (see cuda_backend.h): device discovery, the factory for
// CudaOps, and the device limits the kernel launchers ask for. Host code only, compiled by g++
// against the CUDA runtime headers.
#include "cuda/cuda_backend.h"

#include <cstdio>

#include "cuda/cuda_common.h"
#include "cuda/cuda_ops.h"

namespace pt {

int cuda_device_count() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // No driver (cudaErrorInsufficientDriver on a machine without a GPU), no device, a driver
    // too old...: all mean "no usable GPU", which callers handle, not a failure of this call.
    cudaGetLastError();  // clear the runtime's last-error slot so it is not reported later
    return 0;
  }
  return n;
}

std::string cuda_status_message() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
  }
  if (n == 0) return "the CUDA runtime found no device";
  int dev = 0;
  cudaDeviceProp prop{};
  err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaGetDeviceProperties(&prop, dev);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::to_string(n) + " device(s), but querying one failed: " + cudaGetErrorName(err) + ": " +
           cudaGetErrorString(err);
  }
  char line[512];
  std::snprintf(line, sizeof line, "%s (sm_%d%d, %d SMs, %.1f GiB), device %d of %d", prop.name, prop.major,
                prop.minor, prop.multiProcessorCount,
                static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), dev, n);
  return line;
}

std::unique_ptr<Ops> make_cuda_ops(DType compute_dtype) { return std::make_unique<CudaOps>(compute_dtype); }

int max_dynamic_shared_bytes() {
  int dev = 0, bytes = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return bytes;
}

}  // namespace pt
