// Device-memory helpers (see cuda_memory.h). Host code only, compiled by g++ against the CUDA
// runtime headers.
#include "cuda/cuda_memory.h"

#include <cstdio>

#include "cuda/cuda_common.h"

namespace pt {

void* cuda_malloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it so later calls are not blamed
    char size[64];
    const double mib = static_cast<double>(bytes) / (1024.0 * 1024.0);
    if (mib < 1024.0)
      std::snprintf(size, sizeof size, "%.1f MiB", mib);
    else
      std::snprintf(size, sizeof size, "%.2f GiB", mib / 1024.0);
    throw RuntimeError("cudaMalloc of " + std::to_string(bytes) + " bytes (" + size + ") failed: " +
                       cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  return p;
}

void cuda_free(void* ptr) noexcept {
  // A failure here (e.g. an earlier kernel fault) has already been or will be reported by the
  // call that observes it; a destructor must not throw.
  if (ptr) cudaFree(ptr);
}

void cuda_memcpy_h2d(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
}

void cuda_memcpy_d2h(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
}

void cuda_memset(void* device_dst, int byte_value, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemset(device_dst, byte_value, bytes));
}

void cuda_synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace pt
