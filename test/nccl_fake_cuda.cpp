// The fake CUDA runtime of nccl_fake_cuda.h: host memory as device memory, streams and events as
// handles it checks, and a cuBLASLt handle that is never used. Each function is defined with the
// runtime header's own declaration in view, so a signature that drifts from CUDA's fails to
// compile instead of silently not replacing the real one.
#include "nccl_fake_cuda.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <mutex>
#include <set>

// The runtime's opaque handle types, defined here: the fake's streams and events are these.
struct CUstream_st {
  int unused = 0;
};
struct CUevent_st {
  int unused = 0;
};

namespace pt::test::fake_cuda {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<const char*, size_t> blocks;  // allocation start -> bytes
  std::set<const CUstream_st*> streams;
  std::set<const CUevent_st*> events;
};

Registry& registry() {
  static Registry r;
  return r;
}

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t err) {
  last_error = err;
  return err;
}

// The registry's lock must be held.
bool inside_block(const Registry& r, const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  auto it = r.blocks.upper_bound(c);
  if (it == r.blocks.begin()) return false;
  --it;
  return c >= it->first && bytes <= it->second && static_cast<size_t>(c - it->first) <= it->second - bytes;
}

bool known_stream(const Registry& r, cudaStream_t s) { return s == nullptr || r.streams.count(s) > 0; }

}  // namespace

bool is_device(const void* p, size_t bytes) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return inside_block(r, p, bytes);
}

bool is_stream(CUstream_st* s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return s != nullptr && r.streams.count(s) > 0;
}

size_t live_allocations() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.blocks.size();
}

}  // namespace pt::test::fake_cuda

using pt::test::fake_cuda::fail;
using pt::test::fake_cuda::registry;
using Lock = std::lock_guard<std::mutex>;

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t err = pt::test::fake_cuda::last_error;
  pt::test::fake_cuda::last_error = cudaSuccess;
  return err;
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, pt::test::fake_cuda::kDeviceName, sizeof prop->name - 1);
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->totalGlobalMem = size_t(1) << 30;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = new CUstream_st;
  Lock lock(registry().mutex);
  registry().streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(registry().mutex);
  if (registry().streams.erase(stream) == 0) return fail(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Lock lock(registry().mutex);
  return pt::test::fake_cuda::known_stream(registry(), stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new CUevent_st;
  Lock lock(registry().mutex);
  registry().events.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Lock lock(registry().mutex);
  if (registry().events.erase(event) == 0) return fail(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(registry().mutex);
  const bool ok = registry().events.count(event) && pt::test::fake_cuda::known_stream(registry(), stream);
  return ok ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  Lock lock(registry().mutex);
  const bool ok = registry().events.count(event) && pt::test::fake_cuda::known_stream(registry(), stream);
  return ok ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  char* p = new char[bytes ? bytes : 1];
  Lock lock(registry().mutex);
  registry().blocks[p] = bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  Lock lock(registry().mutex);
  auto it = registry().blocks.find(static_cast<const char*>(ptr));
  if (it == registry().blocks.end()) return fail(cudaErrorInvalidValue);
  registry().blocks.erase(it);
  delete[] static_cast<char*>(ptr);
  return cudaSuccess;
}

// A copy whose device sides must lie in device memory and whose host sides must not: a pointer
// on the wrong side is what a real GPU would fault on (or copy garbage from).
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  {
    Lock lock(registry().mutex);
    const auto& r = registry();
    const bool dst_device = pt::test::fake_cuda::inside_block(r, dst, bytes);
    const bool src_device = pt::test::fake_cuda::inside_block(r, src, bytes);
    bool ok = pt::test::fake_cuda::known_stream(r, stream);
    switch (kind) {
      case cudaMemcpyHostToDevice: ok = ok && dst_device && !src_device; break;
      case cudaMemcpyDeviceToHost: ok = ok && src_device && !dst_device; break;
      case cudaMemcpyDeviceToDevice: ok = ok && dst_device && src_device; break;
      case cudaMemcpyHostToHost: ok = ok && !dst_device && !src_device; break;
      default: break;  // cudaMemcpyDefault: the runtime infers the sides
    }
    if (!ok) return fail(cudaErrorInvalidValue);
  }
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  {
    Lock lock(registry().mutex);
    const auto& r = registry();
    if (!pt::test::fake_cuda::known_stream(r, stream) || !pt::test::fake_cuda::inside_block(r, ptr, bytes))
      return fail(cudaErrorInvalidValue);
  }
  if (bytes) std::memset(ptr, value, bytes);
  return cudaSuccess;
}

// CudaOps makes its cuBLASLt context at construction; the NCCL tests never multiply.
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  static int fake_handle;
  *handle = reinterpret_cast<cublasLtHandle_t>(&fake_handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }

}  // extern "C"
