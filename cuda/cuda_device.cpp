// See cuda_device.h.
#include "cuda/cuda_device.h"

#include <cstdio>

#include "cuda/cuda_common.h"

namespace pt {

void cuda_use_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }

std::string cuda_device_uuid() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  // The 16 bytes in nvidia-smi's form.
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char text[64];
  std::snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return text;
}

}  // namespace pt
