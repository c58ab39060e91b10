// CpuOps memory: the device is host memory. Buffers are 64-byte aligned (one cache line, and
// the widest SIMD load) and zero-filled; the CPU backend computes in f32 and holds only f32 and
// i32 tensors, so upload/download/copy are plain byte copies (no dtype conversion exists here).
// Cost: a small alloc and zero touch every byte once (n * 4 bytes written). A large alloc
// (>= kMapBytes) maps fresh anonymous pages, which the kernel hands out already zeroed when they
// are first touched: GPT-2 124M's start-up allocates 3.3 GB of parameters, gradients, Adam
// moments and activations, and a memset of all of it cost seconds before the first step, only
// for the first step to write most of it again. upload/download/copy move n * 4 bytes. synchronize is a no-op: every op has finished when it returns, which is also why a
// time mark is just the host clock.
#include <omp.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

namespace {

constexpr size_t kAlignment = 64;
// Allocations of at least this many bytes are mapped pages (zeroed by the kernel on first touch);
// smaller ones come from the heap and are memset.
constexpr size_t kMapBytes = size_t{1} << 20;

size_t padded_bytes(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

void check_cpu_dtype(DType dtype, const char* op) {
  // FP8 codes are bytes: the FP8 products' operands (cpu_fp8.cpp), moved as they are.
  const bool fp8 = dtype == DType::f8e4m3 || dtype == DType::f8e5m2;
  check(dtype == DType::f32 || dtype == DType::i32 || fp8,
        std::string("CpuOps::") + op + ": the CPU backend holds f32, i32 and FP8 tensors only, not " + dtype_name(dtype) +
            " (bf16 is a CUDA compute dtype; use precision.compute_dtype=f32 on the CPU)");
}

void check_transfer(const Tensor& t, DType host_dtype, size_t n, const char* op) {
  check_cpu_dtype(t.dtype, op);
  check(host_dtype == t.dtype, std::string("CpuOps::") + op + ": host data is " + dtype_name(host_dtype) +
                                   " but the tensor is " + dtype_name(t.dtype) +
                                   " (the CPU backend does not convert dtypes)");
  cpu::check_size(t, n, op, "tensor");
  check(t.data != nullptr || n == 0, std::string("CpuOps::") + op + ": tensor is null");
}

}  // namespace

Device CpuOps::device() const { return Device::cpu; }

std::string CpuOps::device_description() const {
  return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)";
}

DType CpuOps::compute_dtype() const { return DType::f32; }

Tensor CpuOps::alloc(size_t n, DType dtype) {
  check_cpu_dtype(dtype, "alloc");
  if (n == 0) return Tensor{nullptr, 0, dtype};
  size_t bytes = n * dtype_size(dtype);
  check(bytes / dtype_size(dtype) == n, "CpuOps::alloc: " + std::to_string(n) + " elements overflow size_t");
  // aligned_alloc wants a size that is a multiple of the alignment; mapped pages are page-aligned.
  const size_t padded = padded_bytes(bytes);
  void* p = nullptr;
  if (padded >= kMapBytes) {
    p = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = nullptr;
    // Huge pages where the kernel has them (best effort): first touching GPT-2 124M's weights,
    // gradients and Adam state is page faults, about 30% fewer CPU-seconds with 2 MiB pages.
    else madvise(p, padded, MADV_HUGEPAGE);
  } else {
    p = std::aligned_alloc(kAlignment, padded);
    if (p) std::memset(p, 0, padded);
  }
  if (!p)
    throw RuntimeError("CpuOps::alloc: out of host memory allocating " + std::to_string(bytes) + " bytes (" +
                       std::to_string(n) + " x " + dtype_name(dtype) + ")");
  live_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  return Tensor{p, n, dtype};
}

void CpuOps::release(Tensor& t) {
  if (t.data) {
    live_bytes_ -= t.bytes();
    const size_t padded = padded_bytes(t.bytes());
    if (padded >= kMapBytes) munmap(t.data, padded);
    else std::free(t.data);
  }
  t = Tensor{nullptr, 0, t.dtype};
}

MemoryUse CpuOps::memory_use() const {
  MemoryUse m;
  m.live = live_bytes_;
  m.peak = peak_bytes_;
  return m;  // host memory: no device figures
}

void CpuOps::reset_peak_memory() { peak_bytes_ = live_bytes_; }

void CpuOps::zero(Tensor t) {
  if (t.data) std::memset(t.data, 0, t.bytes());
}

void CpuOps::upload(Tensor dst, const void* host_src, DType host_dtype, size_t n) {
  check_transfer(dst, host_dtype, n, "upload");
  if (n) std::memcpy(dst.data, host_src, n * dtype_size(host_dtype));
}

void CpuOps::download(void* host_dst, DType host_dtype, Tensor src, size_t n) {
  check_transfer(src, host_dtype, n, "download");
  if (n) std::memcpy(host_dst, src.data, n * dtype_size(host_dtype));
}

void CpuOps::copy(Tensor dst, Tensor src, size_t n) {
  check_cpu_dtype(dst.dtype, "copy");
  check(src.dtype == dst.dtype, std::string("CpuOps::copy: src is ") + dtype_name(src.dtype) + " but dst is " +
                                    dtype_name(dst.dtype) + " (the CPU backend does not convert dtypes)");
  cpu::check_size(dst, n, "copy", "dst");
  cpu::check_size(src, n, "copy", "src");
  check((dst.data && src.data) || n == 0, "CpuOps::copy: null tensor");
  // memmove: callers may copy between overlapping slices of one arena.
  if (n) std::memmove(dst.data, src.data, n * dtype_size(src.dtype));
}

void CpuOps::copy_2d(Tensor dst, size_t dst_ld, Tensor src, size_t src_ld, size_t rows, size_t cols) {
  check_cpu_dtype(dst.dtype, "copy_2d");
  check(src.dtype == dst.dtype, std::string("CpuOps::copy_2d: src is ") + dtype_name(src.dtype) + " but dst is " +
                                    dtype_name(dst.dtype));
  check(cols <= dst_ld && cols <= src_ld, "CpuOps::copy_2d: cols exceeds a leading dimension");
  if (rows == 0 || cols == 0) return;
  cpu::check_size(dst, (rows - 1) * dst_ld + cols, "copy_2d", "dst");
  cpu::check_size(src, (rows - 1) * src_ld + cols, "copy_2d", "src");
  const size_t elem = dtype_size(src.dtype);
  char* d = static_cast<char*>(dst.data);
  const char* s = static_cast<const char*>(src.data);
  for (size_t r = 0; r < rows; r++) std::memcpy(d + r * dst_ld * elem, s + r * src_ld * elem, cols * elem);
}

void CpuOps::synchronize() {}

int CpuOps::record_time_mark() {
  marks_.push_back(std::chrono::steady_clock::now());
  return static_cast<int>(marks_.size()) - 1;
}

double CpuOps::ms_between_marks(int a, int b) {
  check(a >= 0 && b >= 0 && static_cast<size_t>(std::max(a, b)) < marks_.size(),
        "CpuOps::ms_between_marks: no such mark (" + std::to_string(a) + ", " + std::to_string(b) + " of " +
            std::to_string(marks_.size()) + ")");
  return std::chrono::duration<double, std::milli>(marks_[static_cast<size_t>(b)] - marks_[static_cast<size_t>(a)]).count();
}

void CpuOps::clear_time_marks() { marks_.clear(); }

}  // namespace pt
