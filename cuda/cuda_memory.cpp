// Device-memory helpers (see cuda_memory.h). Host code only, compiled by g++ against the CUDA
// runtime headers.
#include "cuda/cuda_memory.h"

#include <cstdio>

#include "cuda/cuda_common.h"

namespace pt {

namespace {

std::string human_bytes(size_t bytes) {
  char buf[64];
  const double mib = static_cast<double>(bytes) / (1024.0 * 1024.0);
  if (mib < 1024.0)
    std::snprintf(buf, sizeof buf, "%.1f MiB", mib);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", mib / 1024.0);
  return buf;
}

}  // namespace

std::string cuda_alloc_failure_message(size_t bytes, const std::string& what, const char* error_name,
                                       bool out_of_memory) {
  std::string msg = "CUDA could not allocate " + human_bytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
  if (!what.empty()) msg += " for " + what;
  msg += ": ";
  msg += error_name;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
    msg += "; the GPU has " + human_bytes(free_bytes) + " free of " + human_bytes(total_bytes);
  cudaGetLastError();  // a failed query is not the caller's error
  if (out_of_memory)
    msg +=
        ". The GPU is out of memory. To need less, change the run config: lower batch.micro_batch_size (the "
        "global batch stays the same: batch.grad_accum_steps grows to match); set recompute.mode=selective "
        "(or full) to rebuild activations in backward instead of keeping them; raise parallel.zero_stage "
        "(1 shards the optimizer state, 2 also the gradients, 3 also the parameters) when dp > 1; or split the "
        "model over more GPUs with parallel.tp (within a node) or parallel.pp (across layers). A shorter "
        "batch.seq_len or precision.compute_dtype=bf16 (if it is fp32) also helps. `picotrain plan` estimates "
        "the memory of a config before a run";
  return msg;
}

void* cuda_malloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it so later calls are not blamed
    throw RuntimeError(cuda_alloc_failure_message(bytes, "", cudaGetErrorName(err),
                                                  err == cudaErrorMemoryAllocation));
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
