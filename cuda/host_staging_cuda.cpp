// CudaHostStaging: see host_staging_cuda.h.
#include "cuda/host_staging_cuda.h"

#include <algorithm>

#include "cuda/cuda_common.h"
#include "cuda/cuda_ops.h"

namespace pt {

namespace {

class CudaHostStaging final : public HostStaging {
 public:
  explicit CudaHostStaging(cudaStream_t stream) : stream_(stream) {}
  ~CudaHostStaging() override {
    if (buffer_) cudaFreeHost(buffer_);
  }

  bool on_device(const void* p) const override {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      cudaGetLastError();  // an unknown pointer is host memory; clear the error slot
      return false;
    }
    // Managed memory is readable from the host, but only safely once the GPU is done with it:
    // staging it too keeps the stream order.
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  }

  void* host_buffer(size_t bytes) override {
    if (bytes > capacity_) {
      // Grow by half again at least, so a slowly growing message size does not reallocate each
      // call (cudaFreeHost waits for the device).
      const size_t want = std::max(bytes, capacity_ + capacity_ / 2);
      if (buffer_) CUDA_CHECK(cudaFreeHost(buffer_));
      buffer_ = nullptr;
      capacity_ = 0;
      CUDA_CHECK(cudaHostAlloc(&buffer_, want, cudaHostAllocDefault));
      capacity_ = want;
    }
    return buffer_;
  }

  void to_host(void* host_dst, const void* device_src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void to_device(void* device_dst, const void* host_src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    // From pinned memory the copy is truly asynchronous: wait, because the next MPI call reuses
    // the buffer.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_;
  void* buffer_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

std::shared_ptr<HostStaging> make_cuda_host_staging(Ops& ops) {
  auto* cuda = dynamic_cast<CudaOps*>(&ops);
  check(cuda != nullptr, std::string("device staging needs the CUDA backend, not the ") + device_name(ops.device()));
  return std::make_shared<CudaHostStaging>(static_cast<cudaStream_t>(cuda->stream()));
}

}  // namespace pt
