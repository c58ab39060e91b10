// Device-memory helpers for host code compiled by g++ (GPU tests, benchmarks): thin wrappers over
// the CUDA runtime that throw pt::RuntimeError instead of returning error codes. No CUDA headers
// here. Copies and memsets are synchronous with respect to the host (legacy default stream), so
// a download after a kernel launch on the default stream sees the kernel's results.
#pragma once
#include <cstddef>
#include <string>

namespace pt {

// Allocates `bytes` of device memory (256-byte aligned, not zeroed); nullptr for 0 bytes.
// Throws RuntimeError naming the size when it fails (out of memory, no device); out of memory
// also names what is free on the GPU and the config keys that reduce memory (below).
void* cuda_malloc(size_t bytes);
// The message of a failed device allocation of `bytes` for `what` (e.g. "kernel scratch space"),
// given the CUDA error's name and whether it was out of memory: the size, the GPU's free and
// total memory, and for out of memory the knobs a user can turn (batch.micro_batch_size,
// recompute.mode, parallel.zero_stage, parallel.tp / parallel.pp). Used by cuda_malloc and by
// CudaOps' own allocations, so every out-of-memory error reads the same.
std::string cuda_alloc_failure_message(size_t bytes, const std::string& what, const char* error_name,
                                       bool out_of_memory);
// Frees memory from cuda_malloc; nullptr is a no-op. Never throws (called from destructors).
void cuda_free(void* ptr) noexcept;
void cuda_memcpy_h2d(void* device_dst, const void* host_src, size_t bytes);
void cuda_memcpy_d2h(void* host_dst, const void* device_src, size_t bytes);
// Sets `bytes` bytes to `byte_value` (0xFF is a NaN in both f32 and bf16: the tests' poison).
void cuda_memset(void* device_dst, int byte_value, size_t bytes);
// Waits for all work on the device; reports errors raised while kernels ran.
void cuda_synchronize();

}  // namespace pt
