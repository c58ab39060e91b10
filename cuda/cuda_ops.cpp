// CudaOps (see cuda_ops.h): its lifetime, memory, transfers and time marks. The ops are in
// cuda_ops_layers.cpp, cuda_ops_attention.cpp, cuda_ops_moe.cpp and cuda_ops_fp8.cpp, their
// argument checks in cuda_ops_args.h; recorded work (CUDA graphs) in cuda_ops_graphs.cpp.
// Host code only, compiled by g++ against the CUDA runtime headers.
#include "cuda/cuda_ops.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/cuda_memory.h"
#include "cuda/cuda_ops_args.h"
#include "cuda/elementwise.h"
#include "cuda/matmul_cublaslt.h"
#include "cuda/matmul_fp8.h"

namespace pt {

namespace {

// Elements per chunk when a transfer converts through the scratch buffer (16 MiB of f32).
constexpr size_t kStagingElems = size_t(4) << 20;

// cudaMalloc that turns "out of memory" into a message a user can act on (the size, what is
// free, and the config knobs that reduce memory: cuda_alloc_failure_message, cuda_memory.h).
void* device_alloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaSuccess) return p;
  cudaGetLastError();  // not sticky: clear it so later calls are not blamed
  throw RuntimeError(cuda_alloc_failure_message(bytes, what, cudaGetErrorName(err), err == cudaErrorMemoryAllocation));
}

}  // namespace

using namespace cuda_ops_args;

// ---- lifetime -----------------------------------------------------------------------------------

CudaOps::CudaOps(DType compute_dtype) : compute_(compute_dtype) {
  if (compute_dtype != DType::f32 && compute_dtype != DType::bf16)
    throw ConfigError(std::string("the CUDA backend computes in f32 or bf16, not ") + dtype_name(compute_dtype));
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  char desc[512];
  std::snprintf(desc, sizeof desc, "%s (sm_%d%d, %d SMs, %.1f GiB; compute %s)", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0),
                dtype_name(compute_dtype));
  description_ = desc;
  fp8_ = prop.major > 8 || (prop.major == 8 && prop.minor >= 9);
  fp8_rowwise_ = fp8_ && gpu::fp8_rowwise_available(prop.major);
  cudaStream_t s = nullptr;
  // A blocking stream: it orders with the legacy default stream, so raw cudaMemcpy/cudaMemset on
  // our buffers (tests, cuda_memory.h) see every op queued before them.
  CUDA_CHECK(cudaStreamCreate(&s));
  stream_ = s;
  try {
    matmul_ = gpu::matmul_context_create();
    result_ = static_cast<double*>(device_alloc(sizeof(double), "a reduction result"));
    cudaStream_t side = nullptr;
    CUDA_CHECK(cudaStreamCreate(&side));  // blocking, as stream_
    side_stream_ = side;
    cudaEvent_t fork = nullptr, join = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    fork_ = fork;
    CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    join_ = join;
  } catch (...) {
    release_handles();
    throw;
  }
  const char* streams = std::getenv("PICOTRAIN_MATMUL_STREAMS");
  dw_beside_dinp_ = !(streams && std::string(streams) == "1");
  const char* grouped = std::getenv("PICOTRAIN_GROUPED_MATMUL");
  grouped_kernels_ = !(grouped && std::string(grouped) == "0");
}

void CudaOps::release_handles() noexcept {
  if (matmul_) gpu::matmul_context_destroy(matmul_);
  matmul_ = nullptr;
  if (result_) cudaFree(result_);
  result_ = nullptr;
  if (fork_) cudaEventDestroy(static_cast<cudaEvent_t>(fork_));
  if (join_) cudaEventDestroy(static_cast<cudaEvent_t>(join_));
  if (side_stream_) cudaStreamDestroy(as_stream(side_stream_));
  if (stream_) cudaStreamDestroy(as_stream(stream_));
  fork_ = join_ = side_stream_ = stream_ = nullptr;
}

CudaOps::~CudaOps() {
  // No throwing here: a failure would have surfaced at an earlier synchronising call.
  cudaStreamSynchronize(as_stream(stream_));
  cudaFree(scratch_);
  for (void* p : retired_scratch_) cudaFree(p);
  for (void* e : mark_events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  release_handles();
}

void* CudaOps::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Growing frees the old buffer (cudaFree waits for the kernels that may still use it), unless
  // a recording holds its address: then it stays until the last recording goes.
  const size_t grown = std::max(bytes, scratch_bytes_ + scratch_bytes_ / 2);
  const size_t rounded = (grown + (size_t(1) << 20) - 1) >> 20 << 20;  // whole MiB
  if (recordings_ > 0 && scratch_) retired_scratch_.push_back(scratch_);
  else cudaFree(scratch_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  scratch_ = device_alloc(rounded, "kernel scratch space");
  scratch_bytes_ = rounded;
  return scratch_;
}

// ---- memory ---------------------------------------------------------------------------------------

Tensor CudaOps::alloc(size_t n, DType dtype) {
  if (n == 0) return Tensor{nullptr, 0, dtype};
  const size_t bytes = n * dtype_size(dtype);
  check(bytes / dtype_size(dtype) == n, "CudaOps::alloc: " + std::to_string(n) + " elements overflow size_t");
  void* p = device_alloc(bytes, std::to_string(n) + " x " + dtype_name(dtype));
  live_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, as_stream(stream_)));
  return Tensor{p, n, dtype};
}

void CudaOps::release(Tensor& t) {
  if (t.data) {
    live_bytes_ -= t.bytes();
    // Waits for queued work that may still use it. Never throws: release runs in destructors
    // (ParamStore, the stages), also while an earlier error unwinds, and after a sticky CUDA
    // error cudaFree fails too; a throw then would end the process before that first error is
    // printed. The call that met the error reports it.
    cuda_free(t.data);
  }
  t = Tensor{nullptr, 0, t.dtype};
}

MemoryUse CudaOps::memory_use() const {
  MemoryUse m;
  m.live = live_bytes_;
  m.peak = peak_bytes_;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    m.device_used = total_bytes - free_bytes;
    m.device_total = total_bytes;
  } else {
    cudaGetLastError();  // a failed query is nobody's error
  }
  return m;
}

void CudaOps::zero(Tensor t) {
  if (t.data) CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.bytes(), as_stream(stream_)));
}

void CudaOps::upload(Tensor dst, const void* host_src, DType host_dtype, size_t n) {
  need(dst, n, "upload", "dst");
  if (n == 0) return;
  cudaStream_t s = as_stream(stream_);
  if (host_dtype == dst.dtype) {
    // From pageable memory the copy returns once the source has been staged: the caller may
    // reuse host_src right away.
    CUDA_CHECK(cudaMemcpyAsync(dst.data, host_src, n * dtype_size(host_dtype), cudaMemcpyHostToDevice, s));
    return;
  }
  check(host_dtype == DType::f32 && dst.dtype == DType::bf16,
        std::string("CudaOps::upload: host data is ") + dtype_name(host_dtype) + " but the tensor is " +
            dtype_name(dst.dtype) + " (only f32 -> bf16 converts)");
  // Stage f32 chunks on the device and round them there (one rounding, to nearest even).
  float* staging = static_cast<float*>(scratch(std::min(n, kStagingElems) * sizeof(float)));
  const float* src = static_cast<const float*>(host_src);
  for (size_t off = 0; off < n; off += kStagingElems) {
    const size_t len = std::min(kStagingElems, n - off);
    // Stream order makes the next chunk's copy wait for this chunk's conversion.
    CUDA_CHECK(cudaMemcpyAsync(staging, src + off, len * sizeof(float), cudaMemcpyHostToDevice, s));
    gpu::convert(DType::bf16, static_cast<char*>(dst.data) + off * 2, DType::f32, staging, len, s);
  }
}

void CudaOps::download(void* host_dst, DType host_dtype, Tensor src, size_t n) {
  need(src, n, "download", "src");
  if (n == 0) return;
  cudaStream_t s = as_stream(stream_);
  if (host_dtype == src.dtype) {
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src.data, n * dtype_size(host_dtype), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  check(host_dtype == DType::f32 && src.dtype == DType::bf16,
        std::string("CudaOps::download: host data is ") + dtype_name(host_dtype) + " but the tensor is " +
            dtype_name(src.dtype) + " (only bf16 -> f32 converts)");
  float* staging = static_cast<float*>(scratch(std::min(n, kStagingElems) * sizeof(float)));
  float* dst = static_cast<float*>(host_dst);
  for (size_t off = 0; off < n; off += kStagingElems) {
    const size_t len = std::min(kStagingElems, n - off);
    gpu::convert(DType::f32, staging, DType::bf16, static_cast<const char*>(src.data) + off * 2, len, s);
    CUDA_CHECK(cudaMemcpyAsync(dst + off, staging, len * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

void CudaOps::copy(Tensor dst, Tensor src, size_t n) {
  need(dst, n, "copy", "dst");
  need(src, n, "copy", "src");
  if (n == 0) return;
  cudaStream_t s = as_stream(stream_);
  if (dst.dtype == src.dtype) {
    const size_t bytes = n * dtype_size(src.dtype);
    if (dst.data == src.data) return;
    if (overlap(dst, src, n)) {  // memmove semantics through the scratch buffer
      void* tmp = scratch(bytes);
      CUDA_CHECK(cudaMemcpyAsync(tmp, src.data, bytes, cudaMemcpyDeviceToDevice, s));
      CUDA_CHECK(cudaMemcpyAsync(dst.data, tmp, bytes, cudaMemcpyDeviceToDevice, s));
    } else {
      CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDeviceToDevice, s));
    }
    return;
  }
  check(!overlap(dst, src, n), "CudaOps::copy: a converting copy between overlapping ranges is not supported");
  gpu::convert(dst.dtype, dst.data, src.dtype, src.data, n, s);
}

void CudaOps::copy_2d(Tensor dst, size_t dst_ld, Tensor src, size_t src_ld, size_t rows, size_t cols) {
  check(src.dtype == dst.dtype, where("copy_2d") + ": src is " + dtype_name(src.dtype) + " but dst is " +
                                    dtype_name(dst.dtype));
  check(cols <= dst_ld && cols <= src_ld, where("copy_2d") + ": cols exceeds a leading dimension");
  if (rows == 0 || cols == 0) return;
  need(dst, (rows - 1) * dst_ld + cols, "copy_2d", "dst");
  need(src, (rows - 1) * src_ld + cols, "copy_2d", "src");
  const size_t elem = dtype_size(src.dtype);
  CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst_ld * elem, src.data, src_ld * elem, cols * elem, rows,
                               cudaMemcpyDeviceToDevice, as_stream(stream_)));
}

void CudaOps::synchronize() { CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_))); }

// ---- time marks ------------------------------------------------------------------------------------

int CudaOps::record_time_mark() {
  if (static_cast<size_t>(marks_used_) == mark_events_.size()) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    mark_events_.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(mark_events_[static_cast<size_t>(marks_used_)]),
                             as_stream(stream_)));
  return marks_used_++;
}

std::string CudaOps::matmul_library() const { return gpu::matmul_library(matmul_); }
void CudaOps::time_matmul_algos() { gpu::matmul_start_timing(matmul_); }
MatmulAlgos CudaOps::timed_matmul_algos() const { return gpu::matmul_timed_algos(matmul_); }
void CudaOps::use_matmul_algos(const MatmulAlgos& algos) { gpu::matmul_use_algos(matmul_, algos); }

double CudaOps::ms_between_marks(int a, int b) {
  check(a >= 0 && b >= 0 && std::max(a, b) < marks_used_,
        "CudaOps::ms_between_marks: no such mark (" + std::to_string(a) + ", " + std::to_string(b) + " of " +
            std::to_string(marks_used_) + ")");
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(mark_events_[static_cast<size_t>(a)]),
                                  static_cast<cudaEvent_t>(mark_events_[static_cast<size_t>(b)])));
  return ms;
}

}  // namespace pt
