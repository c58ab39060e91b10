// Device-memory helpers for host code compiled by g++ (GPU tests, benchmarks): thin wrappers over
// the CUDA runtime that throw pt::RuntimeError instead of returning error codes. No CUDA headers
// here. Copies and memsets are synchronous with respect to the host (legacy default stream), so
// a download after a kernel launch on the default stream sees the kernel's results.
#pragma once
#include <cstddef>

namespace pt {

// Allocates `bytes` of device memory (256-byte aligned, not zeroed); nullptr for 0 bytes.
// Throws RuntimeError naming the size when it fails (out of memory, no device).
void* cuda_malloc(size_t bytes);
// Frees memory from cuda_malloc; nullptr is a no-op. Never throws (called from destructors).
void cuda_free(void* ptr) noexcept;
void cuda_memcpy_h2d(void* device_dst, const void* host_src, size_t bytes);
void cuda_memcpy_d2h(void* host_dst, const void* device_src, size_t bytes);
// Sets `bytes` bytes to `byte_value` (0xFF is a NaN in both f32 and bf16: the tests' poison).
void cuda_memset(void* device_dst, int byte_value, size_t bytes);
// Waits for all work on the device; reports errors raised while kernels ran.
void cuda_synchronize();

}  // namespace pt
