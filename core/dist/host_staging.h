// HostStaging: how MpiComm moves device tensors. MPI reads and writes host memory only (we do
// not assume a CUDA-aware MPI), so a tensor in GPU memory is copied into pinned host memory
// before an MPI call and back after it. That is slower than NCCL, but it works with any MPI and
// lets several ranks share one GPU (NCCL refuses that), which is how the multi-rank GPU tests
// run on a machine with one GPU.
//
// The CUDA implementation is cuda/host_staging_cuda.h; test/mpi_comm_staging.cpp uses a fake
// whose "device" memory is kept scrambled, so a buffer MpiComm forgot to stage gives wrong
// numbers. The header is an interface only, like Comm, so the CUDA library can implement it
// without linking core.
#pragma once
#include <cstddef>

namespace pt {

class HostStaging {
 public:
  virtual ~HostStaging() = default;

  // True when `p` points into device memory that MPI cannot read, i.e. the tensor needs staging.
  // Host buffers (the coordination helpers' vectors) pass through untouched.
  virtual bool on_device(const void* p) const = 0;
  // At least `bytes` of pinned host memory, reused by every call: valid until the next call.
  // One buffer serves every communicator of the process, which is safe because MPI calls are
  // blocking and made from one thread.
  virtual void* host_buffer(size_t bytes) = 0;
  // Copy in order after everything queued on the device's compute stream, and return when the
  // copy is complete (the host buffer holds the data; the device buffer may be read by the next op).
  virtual void to_host(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual void to_device(void* device_dst, const void* host_src, size_t bytes) = 0;
};

}  // namespace pt
