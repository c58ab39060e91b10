// CudaOps (see cuda_ops.h): argument checks, memory, transfers, and the dispatch of every op
// to its kernels. Host code only, compiled by g++ against the CUDA runtime headers.
#include "cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>

#include "cuda/adamw.h"
#include "cuda/attention.h"
#include "cuda/cross_entropy.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_memory.h"
#include "cuda/elementwise.h"
#include "cuda/embedding.h"
#include "cuda/gelu.h"
#include "cuda/layernorm.h"
#include "cuda/norm_backward.h"
#include "cuda/matmul_cublaslt.h"
#include "cuda/moe.h"
#include "cuda/reduce.h"
#include "cuda/rmsnorm.h"
#include "cuda/rope.h"
#include "cuda/swiglu.h"

namespace pt {

namespace {

// Elements per chunk when a transfer converts through the scratch buffer (16 MiB of f32).
constexpr size_t kStagingElems = size_t(4) << 20;

std::string where(const char* op) { return std::string("CudaOps::") + op; }

// cudaMalloc that turns "out of memory" into a message a user can act on (the size, what is
// free, and the config knobs that reduce memory: cuda_alloc_failure_message, cuda_memory.h).
void* device_alloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaSuccess) return p;
  cudaGetLastError();  // not sticky: clear it so later calls are not blamed
  throw RuntimeError(cuda_alloc_failure_message(bytes, what, cudaGetErrorName(err), err == cudaErrorMemoryAllocation));
}

// ---- argument checks: a wrong dtype or a buffer too small names the op and the argument ----

void need(const Tensor& t, size_t n, const char* op, const char* name) {
  check(t.data != nullptr || n == 0, where(op) + ": " + name + " is null");
  check(t.numel >= n, where(op) + ": " + name + " holds " + std::to_string(t.numel) + " elements, the shape needs " +
                          std::to_string(n));
}

void need(const Tensor& t, size_t n, DType dtype, const char* op, const char* name) {
  need(t, n, op, name);
  check(t.dtype == dtype || t.data == nullptr, where(op) + ": " + name + " is " + dtype_name(t.dtype) + ", expected " +
                                                   dtype_name(dtype));
}

// An activation tensor: f32 or bf16. Returns its dtype.
DType need_act(const Tensor& t, size_t n, const char* op, const char* name) {
  need(t, n, op, name);
  check(t.dtype == DType::f32 || t.dtype == DType::bf16,
        where(op) + ": " + name + " is " + dtype_name(t.dtype) + ", expected f32 or bf16");
  return t.dtype;
}

void check_dims(const char* op, std::initializer_list<long long> dims) {
  for (long long d : dims) check(d >= 0, where(op) + ": negative dimension " + std::to_string(d));
}

// Parameter gradients that travel together (dw and db) must share one dtype.
DType grad_dtype(const char* op, std::initializer_list<const Tensor*> grads, DType fallback) {
  DType d = fallback;
  bool found = false;
  for (const Tensor* g : grads) {
    if (!*g) continue;
    check(!found || g->dtype == d, where(op) + ": the parameter gradients have different dtypes");
    d = g->dtype;
    found = true;
  }
  return d;
}

bool overlap(const Tensor& a, const Tensor& b, size_t n) {
  const char* pa = static_cast<const char*>(a.data);
  const char* pb = static_cast<const char*>(b.data);
  return pa < pb + n * dtype_size(b.dtype) && pb < pa + n * dtype_size(a.dtype);
}

}  // namespace

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
  cudaStream_t s = nullptr;
  // A blocking stream: it orders with the legacy default stream, so raw cudaMemcpy/cudaMemset on
  // our buffers (tests, cuda_memory.h) see every op queued before them.
  CUDA_CHECK(cudaStreamCreate(&s));
  stream_ = s;
  try {
    matmul_ = gpu::matmul_context_create();
    result_ = static_cast<double*>(device_alloc(sizeof(double), "a reduction result"));
  } catch (...) {
    if (matmul_) gpu::matmul_context_destroy(matmul_);
    cudaStreamDestroy(s);
    throw;
  }
}

CudaOps::~CudaOps() {
  // No throwing here: a failure would have surfaced at an earlier synchronising call.
  cudaStreamSynchronize(as_stream(stream_));
  gpu::matmul_context_destroy(matmul_);
  cudaFree(scratch_);
  cudaFree(result_);
  for (void* e : mark_events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  cudaStreamDestroy(as_stream(stream_));
}

void* CudaOps::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Growing frees the old buffer; cudaFree waits for the kernels that may still use it.
  const size_t grown = std::max(bytes, scratch_bytes_ + scratch_bytes_ / 2);
  const size_t rounded = (grown + (size_t(1) << 20) - 1) >> 20 << 20;  // whole MiB
  cudaFree(scratch_);
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

double CudaOps::ms_between_marks(int a, int b) {
  check(a >= 0 && b >= 0 && std::max(a, b) < marks_used_,
        "CudaOps::ms_between_marks: no such mark (" + std::to_string(a) + ", " + std::to_string(b) + " of " +
            std::to_string(marks_used_) + ")");
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(mark_events_[static_cast<size_t>(a)]),
                                  static_cast<cudaEvent_t>(mark_events_[static_cast<size_t>(b)])));
  return ms;
}

// ---- embeddings -----------------------------------------------------------------------------------

void CudaOps::embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int vocab_start,
                                int vocab_local) {
  check_dims("embedding_forward", {N, C, vocab_local});
  const DType dt = need_act(wte, size_t(vocab_local) * C, "embedding_forward", "wte");
  need(out, size_t(N) * C, dt, "embedding_forward", "out");
  need(tokens, N, DType::i32, "embedding_forward", "tokens");
  gpu::embedding_forward(dt, out.data, static_cast<const int32_t*>(tokens.data), wte.data, N, C, vocab_start,
                         vocab_local, stream_);
}

void CudaOps::embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int vocab_start,
                                 int vocab_local) {
  check_dims("embedding_backward", {N, C, vocab_local});
  if (!dwte) return;
  need(dwte, size_t(vocab_local) * C, "embedding_backward", "dwte");
  const DType dt = need_act(dout, size_t(N) * C, "embedding_backward", "dout");
  need(tokens, N, DType::i32, "embedding_backward", "tokens");
  const size_t bytes = gpu::embedding_backward_scratch_bytes(N, C, vocab_local);
  gpu::embedding_backward(dt, dwte.dtype, dwte.data, dout.data, static_cast<const int32_t*>(tokens.data), N, C,
                          vocab_start, vocab_local, scratch(bytes), bytes, stream_);
}

void CudaOps::position_forward(Tensor out, Tensor wpe, Tensor pos, int B, int T, int C) {
  check_dims("position_forward", {B, T, C});
  check(C > 0 || size_t(B) * T == 0, "CudaOps::position_forward: C must be positive");
  const DType dt = need_act(out, size_t(B) * T * C, "position_forward", "out");
  need(wpe, C, dt, "position_forward", "wpe");
  need(pos, T, DType::i32, "position_forward", "pos");
  const int rows = C > 0 ? static_cast<int>(std::min<size_t>(wpe.numel / C, 0x7fffffff)) : 0;
  gpu::position_forward(dt, out.data, wpe.data, static_cast<const int32_t*>(pos.data), B, T, C, rows, stream_);
}

void CudaOps::position_backward(Tensor dwpe, Tensor dout, Tensor pos, int B, int T, int C) {
  check_dims("position_backward", {B, T, C});
  if (!dwpe || C == 0) return;
  const DType dt = need_act(dout, size_t(B) * T * C, "position_backward", "dout");
  need(pos, T, DType::i32, "position_backward", "pos");
  const int rows = static_cast<int>(std::min<size_t>(dwpe.numel / C, 0x7fffffff));
  gpu::position_backward(dt, dwpe.dtype, dwpe.data, dout.data, static_cast<const int32_t*>(pos.data), B, T, C, rows,
                         stream_);
}

// ---- LayerNorm -----------------------------------------------------------------------------------

void CudaOps::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, int N, int C) {
  check_dims("layernorm_forward", {N, C});
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(inp, NC, "layernorm_forward", "inp");
  need(out, NC, dt, "layernorm_forward", "out");
  need(w, C, dt, "layernorm_forward", "w");
  need(b, C, dt, "layernorm_forward", "b");
  if (mean) need(mean, N, DType::f32, "layernorm_forward", "mean");
  if (rstd) need(rstd, N, DType::f32, "layernorm_forward", "rstd");
  gpu::layernorm_forward(dt, out.data, static_cast<float*>(mean.data), static_cast<float*>(rstd.data), inp.data,
                         w.data, b.data, N, C, stream_);
}

void CudaOps::residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b,
                                         Tensor w, Tensor bias, int N, int C) {
  const char* op = "residual_layernorm_forward";
  check_dims(op, {N, C});
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(a, NC, op, "a");
  need(b, NC, dt, op, "b");
  need(residual, NC, dt, op, "residual");
  need(out, NC, dt, op, "out");
  need(w, C, dt, op, "w");
  need(bias, C, dt, op, "bias");
  if (mean) need(mean, N, DType::f32, op, "mean");
  if (rstd) need(rstd, N, DType::f32, op, "rstd");
  if (NC == 0) return;
  check(!overlap(out, residual, NC) && !overlap(out, a, NC) && !overlap(out, b, NC),
        where(op) + ": out overlaps residual, a or b");
  // The LayerNorm must be bitwise layernorm_forward's on the stored residual (recompute rebuilds
  // it that way). Both kernels sum a row in 16-byte chunks when C and their pointers allow it, in
  // single elements otherwise; the fused kernel also needs a and b aligned for its chunks. When
  // only a or b stands in the way (an odd slice), run the two kernels so the LayerNorm still
  // takes the chunked path layernorm_forward would.
  const int V = 16 / static_cast<int>(dtype_size(dt));
  const bool ln_chunked = C % V == 0 && is_aligned(out.data, 16) && is_aligned(residual.data, 16) &&
                          is_aligned(w.data, 16) && is_aligned(bias.data, 16);
  if (ln_chunked && !(is_aligned(a.data, 16) && is_aligned(b.data, 16))) {
    gpu::add(dt, residual.data, a.data, b.data, NC, stream_);
    gpu::layernorm_forward(dt, out.data, static_cast<float*>(mean.data), static_cast<float*>(rstd.data),
                           residual.data, w.data, bias.data, N, C, stream_);
    return;
  }
  gpu::fused_residual_layernorm_forward(dt, residual.data, out.data, static_cast<float*>(mean.data),
                                        static_cast<float*>(rstd.data), a.data, b.data, w.data, bias.data, N, C,
                                        stream_);
}

void CudaOps::layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                                 Tensor rstd, int N, int C) {
  check_dims("layernorm_backward", {N, C});
  if (!dinp && !dw && !db) return;
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(dout, NC, "layernorm_backward", "dout");
  need(inp, NC, dt, "layernorm_backward", "inp");
  need(mean, N, DType::f32, "layernorm_backward", "mean");
  need(rstd, N, DType::f32, "layernorm_backward", "rstd");
  if (dinp) {
    need(dinp, NC, dt, "layernorm_backward", "dinp");
    need(w, C, dt, "layernorm_backward", "w");
  }
  if (dw) need(dw, C, "layernorm_backward", "dw");
  if (db) need(db, C, "layernorm_backward", "db");
  const DType gt = grad_dtype("layernorm_backward", {&dw, &db}, DType::f32);
  void* s = (dw || db) ? scratch(gpu::layernorm_backward_scratch_bytes(N, C)) : nullptr;
  gpu::layernorm_backward(dt, gt, dinp.data, dw.data, db.data, dout.data, inp.data, w.data,
                          static_cast<const float*>(mean.data), static_cast<const float*>(rstd.data), N, C, s,
                          stream_);
}

// ---- linear layer --------------------------------------------------------------------------------

void CudaOps::matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC) {
  check_dims("matmul_forward", {N, IC, OC});
  const DType dt = need_act(inp, size_t(N) * IC, "matmul_forward", "inp");
  need(w, size_t(OC) * IC, dt, "matmul_forward", "w");
  const DType ot = need_act(out, size_t(N) * OC, "matmul_forward", "out");
  check(ot == dt || ot == DType::f32,
        "CudaOps::matmul_forward: out must be " + std::string(dtype_name(dt)) + " or f32");
  if (bias) need(bias, OC, ot, "matmul_forward", "bias");
  gpu::matmul_forward(matmul_, dt, ot, out.data, inp.data, w.data, bias.data, N, IC, OC, stream_);
}

void CudaOps::matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N, int IC,
                              int OC) {
  check_dims("matmul_backward", {N, IC, OC});
  if (!dinp && !dw && !dbias) return;
  const DType dt = need_act(dout, size_t(N) * OC, "matmul_backward", "dout");
  if (dinp) {
    const DType it = need_act(dinp, size_t(N) * IC, "matmul_backward", "dinp");
    check(it == dt || it == DType::f32,
          "CudaOps::matmul_backward: dinp must be " + std::string(dtype_name(dt)) + " or f32");
    need(w, size_t(OC) * IC, dt, "matmul_backward", "w");
    gpu::matmul_backward_input(matmul_, dt, it, dinp.data, dout.data, w.data, N, IC, OC, stream_);
  }
  if (dbias) need(dbias, OC, "matmul_backward", "dbias");
  void* db_scratch = dbias ? scratch(gpu::bias_backward_scratch_bytes(N, OC)) : nullptr;
  if (dw) {  // dbias (if wanted) comes with dW, from the same product where cuBLASLt can
    const DType wt = need_act(dw, size_t(OC) * IC, "matmul_backward", "dw");
    check(wt == dt || wt == DType::f32,
          "CudaOps::matmul_backward: dw must be " + std::string(dtype_name(dt)) + " or f32");
    need(inp, size_t(N) * IC, dt, "matmul_backward", "inp");
    gpu::matmul_backward_weight(matmul_, dt, wt, dw.data, dbias.dtype, dbias.data, dout.data, inp.data, N, IC, OC,
                                db_scratch, stream_);
  } else if (dbias) {
    gpu::bias_backward(dt, dbias.dtype, dbias.data, dout.data, N, OC, db_scratch, stream_);
  }
}

// The GELU-fused pair (gpu::matmul_gelu_forward, matmul_backward_input_dgelu): one dtype for
// every tensor, the activations'.
void CudaOps::matmul_gelu_forward(Tensor out, Tensor out_pre, Tensor inp, Tensor w, Tensor bias, int N, int IC,
                                  int OC) {
  check_dims("matmul_gelu_forward", {N, IC, OC});
  const DType dt = need_act(inp, size_t(N) * IC, "matmul_gelu_forward", "inp");
  need(w, size_t(OC) * IC, dt, "matmul_gelu_forward", "w");
  need(out, size_t(N) * OC, dt, "matmul_gelu_forward", "out");
  need(out_pre, size_t(N) * OC, dt, "matmul_gelu_forward", "out_pre");
  if (bias) need(bias, OC, dt, "matmul_gelu_forward", "bias");
  gpu::matmul_gelu_forward(matmul_, dt, out.data, out_pre.data, inp.data, w.data, bias.data, N, IC, OC, stream_);
}

void CudaOps::matmul_backward_input_dgelu(Tensor dpre, Tensor dout, Tensor w, Tensor pre, int N, int IC, int OC) {
  check_dims("matmul_backward_input_dgelu", {N, IC, OC});
  const DType dt = need_act(dout, size_t(N) * OC, "matmul_backward_input_dgelu", "dout");
  need(dpre, size_t(N) * IC, dt, "matmul_backward_input_dgelu", "dpre");
  need(w, size_t(OC) * IC, dt, "matmul_backward_input_dgelu", "w");
  need(pre, size_t(N) * IC, dt, "matmul_backward_input_dgelu", "pre");
  gpu::matmul_backward_input_dgelu(matmul_, dt, dpre.data, dout.data, w.data, pre.data, N, IC, OC, stream_);
}

// ---- attention -----------------------------------------------------------------------------------

namespace {
int head_size(const char* op, int C, int NH) {
  check(NH > 0 && C % NH == 0, where(op) + ": n_heads=" + std::to_string(NH) + " must be positive and divide C=" +
                                   std::to_string(C));
  return C / NH;
}
// The head size of grouped-query attention: NH query heads of C / NH channels sharing NKV
// key/value heads, NKV dividing NH.
int gqa_head_size(const char* op, int C, int NH, int NKV) {
  const int HS = head_size(op, C, NH);
  check(NKV > 0 && NH % NKV == 0, where(op) + ": n_kv_heads=" + std::to_string(NKV) +
                                      " must be positive and divide n_heads=" + std::to_string(NH));
  return HS;
}
}  // namespace

void CudaOps::attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) {
  check_dims("attention_forward", {B, T, C});
  const int HS = gqa_head_size("attention_forward", C, NH, NKV);
  const size_t BT = size_t(B) * T, W = size_t(NH + 2 * NKV) * HS;  // W: the packed q | k | v row
  const DType dt = need_act(qkv, BT * W, "attention_forward", "qkv");
  need(out, BT * C, dt, "attention_forward", "out");
  need(lse, size_t(B) * NH * T, DType::f32, "attention_forward", "lse");
  float* L = static_cast<float*>(lse.data);
  if (gpu::flash_attention_supported(dt, HS, qkv.data, out.data, nullptr))
    gpu::flash_attention_forward_bf16(out.data, L, qkv.data, B, T, NH, NKV, HS, stream_);
  else
    gpu::attention_forward_tiled(dt, out.data, L, qkv.data, B, T, NH, NKV, HS, stream_);
}

void CudaOps::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int C,
                                 int NH, int NKV) {
  check_dims("attention_backward", {B, T, C});
  const int HS = gqa_head_size("attention_backward", C, NH, NKV);
  if (!dqkv) return;
  const size_t BT = size_t(B) * T, W = size_t(NH + 2 * NKV) * HS;
  const DType dt = need_act(qkv, BT * W, "attention_backward", "qkv");
  need(dqkv, BT * W, dt, "attention_backward", "dqkv");
  need(dout, BT * C, dt, "attention_backward", "dout");
  need(out, BT * C, dt, "attention_backward", "out");
  need(lse, size_t(B) * NH * T, DType::f32, "attention_backward", "lse");
  const bool flash = gpu::flash_attention_supported(dt, HS, qkv.data, dout.data, dqkv.data);
  // One scratch request for D and the flash kernel's workspace (a second request could move the first).
  const size_t d_bytes = (size_t(B) * NH * T * sizeof(float) + 255) / 256 * 256;
  const size_t ws_bytes = flash ? gpu::flash_attention_backward_workspace_bytes(B, T, NH, NKV, HS) : 0;
  char* space = static_cast<char*>(scratch(d_bytes + ws_bytes));
  float* D = reinterpret_cast<float*>(space);
  gpu::attention_row_dot(dt, D, dout.data, out.data, B, T, NH, HS, stream_);
  const float* L = static_cast<const float*>(lse.data);
  if (flash)
    gpu::flash_attention_backward_bf16(dqkv.data, dout.data, qkv.data, L, D, B, T, NH, NKV, HS, space + d_bytes,
                                       stream_);
  else
    gpu::attention_backward_tiled(dt, dqkv.data, dout.data, qkv.data, L, D, B, T, NH, NKV, HS, stream_);
}

void CudaOps::attention_block_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int Tq, int Tk,
                                      int C, int NH, int NKV, int q_pos0, int k_pos0, bool causal) {
  const char* op = "attention_block_forward";
  check_dims(op, {B, Tq, Tk, C});
  const int HS = gqa_head_size(op, C, NH, NKV);
  const size_t nk = size_t(B) * Tk * NKV * HS;
  const DType dt = need_act(q, size_t(B) * Tq * C, op, "q");
  need(k, nk, dt, op, "k");
  need(v, nk, dt, op, "v");
  need(out, size_t(B) * Tq * C, dt, op, "out");
  need(lse, size_t(B) * NH * Tq, DType::f32, op, "lse");
  gpu::attention_block_forward_tiled(dt, out.data, static_cast<float*>(lse.data), q.data, k.data, v.data, B, Tq, Tk,
                                     NH, NKV, HS, q_pos0, k_pos0, causal, stream_);
}

void CudaOps::attention_block_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                                       Tensor out, Tensor lse, int B, int Tq, int Tk, int C, int NH, int NKV,
                                       int q_pos0, int k_pos0, bool causal) {
  const char* op = "attention_block_backward";
  check_dims(op, {B, Tq, Tk, C});
  const int HS = gqa_head_size(op, C, NH, NKV);
  if (!dq && !dk && !dv) return;
  const size_t nq = size_t(B) * Tq * C, nk = size_t(B) * Tk * NKV * HS;
  const DType dt = need_act(q, nq, op, "q");
  need(k, nk, dt, op, "k");
  need(v, nk, dt, op, "v");
  need(dout, nq, dt, op, "dout");
  need(out, nq, dt, op, "out");
  need(lse, size_t(B) * NH * Tq, DType::f32, op, "lse");
  if (dq) need(dq, nq, dt, op, "dq");
  if (dk) need(dk, nk, dt, op, "dk");
  if (dv) need(dv, nk, dt, op, "dv");
  float* D = static_cast<float*>(scratch(size_t(B) * NH * Tq * sizeof(float)));
  gpu::attention_row_dot(dt, D, dout.data, out.data, B, Tq, NH, HS, stream_);
  gpu::attention_block_backward_tiled(dt, dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data,
                                      static_cast<const float*>(lse.data), D, B, Tq, Tk, NH, NKV, HS, q_pos0,
                                      k_pos0, causal, stream_);
}

void CudaOps::merge_attention_partials(Tensor out_acc, Tensor lse_acc, Tensor out_part, Tensor lse_part, int B, int T,
                                       int C, int NH) {
  const char* op = "merge_attention_partials";
  check_dims(op, {B, T, C});
  const int HS = head_size(op, C, NH);
  const DType dt = need_act(out_acc, size_t(B) * T * C, op, "out_acc");
  need(out_part, size_t(B) * T * C, dt, op, "out_part");
  need(lse_acc, size_t(B) * NH * T, DType::f32, op, "lse_acc");
  need(lse_part, size_t(B) * NH * T, DType::f32, op, "lse_part");
  gpu::merge_attention_partials_gpu(dt, out_acc.data, static_cast<float*>(lse_acc.data), out_part.data,
                                    static_cast<const float*>(lse_part.data), B, T, NH, HS, stream_);
}

// ---- elementwise ---------------------------------------------------------------------------------

void CudaOps::gelu_forward(Tensor out, Tensor inp, size_t n) {
  const DType dt = need_act(inp, n, "gelu_forward", "inp");
  need(out, n, dt, "gelu_forward", "out");
  gpu::gelu_forward(dt, out.data, inp.data, n, stream_);
}

void CudaOps::gelu_backward(Tensor dinp, Tensor inp, Tensor dout, size_t n) {
  if (!dinp) return;
  const DType dt = need_act(inp, n, "gelu_backward", "inp");
  need(dinp, n, dt, "gelu_backward", "dinp");
  need(dout, n, dt, "gelu_backward", "dout");
  gpu::gelu_backward(dt, dinp.data, inp.data, dout.data, n, stream_);
}

void CudaOps::add(Tensor out, Tensor a, Tensor b, size_t n) {
  const DType dt = need_act(a, n, "add", "a");
  need(b, n, dt, "add", "b");
  need(out, n, dt, "add", "out");
  gpu::add(dt, out.data, a.data, b.data, n, stream_);
}

void CudaOps::scale(Tensor x, float s, size_t n) {
  const DType dt = need_act(x, n, "scale", "x");
  gpu::scale(dt, x.data, s, n, stream_);
}

// ---- Llama: RMSNorm, RoPE, SwiGLU --------------------------------------------------------------

void CudaOps::rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, int N, int C, float eps) {
  check_dims("rmsnorm_forward", {N, C});
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(inp, NC, "rmsnorm_forward", "inp");
  need(out, NC, dt, "rmsnorm_forward", "out");
  need(w, C, dt, "rmsnorm_forward", "w");
  if (rstd) need(rstd, N, DType::f32, "rmsnorm_forward", "rstd");
  gpu::rmsnorm_forward(dt, out.data, static_cast<float*>(rstd.data), inp.data, w.data, N, C, eps, stream_);
}

void CudaOps::residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor w, int N,
                                       int C, float eps) {
  const char* op = "residual_rmsnorm_forward";
  check_dims(op, {N, C});
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(a, NC, op, "a");
  need(b, NC, dt, op, "b");
  need(residual, NC, dt, op, "residual");
  need(out, NC, dt, op, "out");
  need(w, C, dt, op, "w");
  if (rstd) need(rstd, N, DType::f32, op, "rstd");
  if (NC == 0) return;
  check(!overlap(out, residual, NC) && !overlap(out, a, NC) && !overlap(out, b, NC),
        where(op) + ": out overlaps residual, a or b");
  // Bitwise rmsnorm_forward on the stored residual needs the same summation path (16-byte chunks
  // or single elements) as rmsnorm_forward would take; when only a or b keeps the fused kernel
  // off the chunked path, run the two kernels instead (as residual_layernorm_forward does).
  const int V = 16 / static_cast<int>(dtype_size(dt));
  const bool norm_chunked =
      C % V == 0 && is_aligned(out.data, 16) && is_aligned(residual.data, 16) && is_aligned(w.data, 16);
  float* rs = static_cast<float*>(rstd.data);
  if (norm_chunked && !(is_aligned(a.data, 16) && is_aligned(b.data, 16))) {
    gpu::add(dt, residual.data, a.data, b.data, NC, stream_);
    gpu::rmsnorm_forward(dt, out.data, rs, residual.data, w.data, N, C, eps, stream_);
    return;
  }
  gpu::fused_residual_rmsnorm_forward(dt, residual.data, out.data, rs, a.data, b.data, w.data, N, C, eps, stream_);
}

void CudaOps::rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd, int N, int C) {
  const char* op = "rmsnorm_backward";
  check_dims(op, {N, C});
  if (!dinp && !dw) return;
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(dout, NC, op, "dout");
  need(inp, NC, dt, op, "inp");
  need(rstd, N, DType::f32, op, "rstd");
  if (dinp) {
    need(dinp, NC, dt, op, "dinp");
    need(w, C, dt, op, "w");
  }
  if (dw) need(dw, C, op, "dw");
  const DType gt = grad_dtype(op, {&dw}, DType::f32);
  void* s = dw ? scratch(gpu::rmsnorm_backward_scratch_bytes(N, C)) : nullptr;
  gpu::rmsnorm_backward(dt, gt, dinp.data, dw.data, dout.data, inp.data, w.data, static_cast<const float*>(rstd.data),
                        N, C, s, stream_);
}

void CudaOps::rope_forward(Tensor qkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS, float theta) {
  check_dims("rope_forward", {B, T, row_width, rot_heads, HS});
  const DType dt = need_act(qkv, size_t(B) * T * row_width, "rope_forward", "qkv");
  need(pos, T, DType::i32, "rope_forward", "pos");
  gpu::rope_forward(dt, qkv.data, static_cast<const int32_t*>(pos.data), B, T, row_width, rot_heads, HS, theta,
                    stream_);
}

void CudaOps::rope_backward(Tensor dqkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS,
                            float theta) {
  check_dims("rope_backward", {B, T, row_width, rot_heads, HS});
  const DType dt = need_act(dqkv, size_t(B) * T * row_width, "rope_backward", "dqkv");
  need(pos, T, DType::i32, "rope_backward", "pos");
  gpu::rope_backward(dt, dqkv.data, static_cast<const int32_t*>(pos.data), B, T, row_width, rot_heads, HS, theta,
                     stream_);
}

void CudaOps::swiglu_forward(Tensor out, Tensor gate_up, int N, int H) {
  check_dims("swiglu_forward", {N, H});
  const DType dt = need_act(gate_up, size_t(N) * 2 * H, "swiglu_forward", "gate_up");
  need(out, size_t(N) * H, dt, "swiglu_forward", "out");
  gpu::swiglu_forward(dt, out.data, gate_up.data, N, H, stream_);
}

void CudaOps::swiglu_backward(Tensor dgate_up, Tensor gate_up, Tensor dout, int N, int H) {
  check_dims("swiglu_backward", {N, H});
  if (!dgate_up) return;
  const DType dt = need_act(gate_up, size_t(N) * 2 * H, "swiglu_backward", "gate_up");
  need(dgate_up, size_t(N) * 2 * H, dt, "swiglu_backward", "dgate_up");
  need(dout, size_t(N) * H, dt, "swiglu_backward", "dout");
  gpu::swiglu_backward(dt, dgate_up.data, gate_up.data, dout.data, N, H, stream_);
}

// ---- mixture of experts ----------------------------------------------------------------------
// slot_of lives on the device, so that it is a permutation of [0, N k) is the host routing plan's
// promise (core/model/moe_layer.h), not checked here; the kernels skip a slot out of range.

void CudaOps::moe_router_forward(Tensor probs, Tensor topk_expert, Tensor topk_weight, Tensor logits, int N, int E,
                                 int k) {
  const char* op = "moe_router_forward";
  check_dims(op, {N, E, k});
  check(k >= 1 && k <= E,
        where(op) + ": top-k of " + std::to_string(k) + " from " + std::to_string(E) + " experts");
  const size_t NE = size_t(N) * E, NK = size_t(N) * k;
  const DType dt = need_act(logits, NE, op, "logits");
  need(probs, NE, DType::f32, op, "probs");
  need(topk_expert, NK, DType::i32, op, "topk_expert");
  need(topk_weight, NK, DType::f32, op, "topk_weight");
  gpu::moe_router_forward(dt, static_cast<float*>(probs.data), static_cast<int32_t*>(topk_expert.data),
                          static_cast<float*>(topk_weight.data), logits.data, N, E, k, stream_);
}

void CudaOps::moe_router_backward(Tensor dlogits, Tensor probs, Tensor topk_expert, Tensor topk_weight,
                                  Tensor dtopk_weight, Tensor dprobs_all, int N, int E, int k) {
  const char* op = "moe_router_backward";
  check_dims(op, {N, E, k});
  if (!dlogits) return;
  const size_t NE = size_t(N) * E, NK = size_t(N) * k;
  const DType dt = need_act(dlogits, NE, op, "dlogits");
  need(probs, NE, DType::f32, op, "probs");
  need(topk_expert, NK, DType::i32, op, "topk_expert");
  need(topk_weight, NK, DType::f32, op, "topk_weight");
  need(dtopk_weight, NK, DType::f32, op, "dtopk_weight");
  need(dprobs_all, E, DType::f32, op, "dprobs_all");
  gpu::moe_router_backward(dt, dlogits.data, static_cast<const float*>(probs.data),
                           static_cast<const int32_t*>(topk_expert.data), static_cast<const float*>(topk_weight.data),
                           static_cast<const float*>(dtopk_weight.data), static_cast<const float*>(dprobs_all.data), N,
                           E, k, stream_);
}

void CudaOps::moe_permute(Tensor out, Tensor x, Tensor slot_of, int N, int C, int k) {
  const char* op = "moe_permute";
  check_dims(op, {N, C, k});
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(x, NC, op, "x");
  need(out, NC * k, dt, op, "out");
  need(slot_of, size_t(N) * k, DType::i32, op, "slot_of");
  gpu::moe_permute(dt, out.data, x.data, static_cast<const int32_t*>(slot_of.data), N, C, k, stream_);
}

void CudaOps::moe_permute_backward(Tensor dx, Tensor dout, Tensor slot_of, int N, int C, int k) {
  const char* op = "moe_permute_backward";
  check_dims(op, {N, C, k});
  if (!dx) return;
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(dx, NC, op, "dx");
  need(dout, NC * k, dt, op, "dout");
  need(slot_of, size_t(N) * k, DType::i32, op, "slot_of");
  gpu::moe_permute_backward(dt, dx.data, dout.data, static_cast<const int32_t*>(slot_of.data), N, C, k, stream_);
}

void CudaOps::moe_combine(Tensor y, Tensor expert_out, Tensor topk_weight, Tensor slot_of, int N, int C, int k) {
  const char* op = "moe_combine";
  check_dims(op, {N, C, k});
  const size_t NC = size_t(N) * C, NK = size_t(N) * k;
  const DType dt = need_act(y, NC, op, "y");
  need(expert_out, NK * C, dt, op, "expert_out");
  need(topk_weight, NK, DType::f32, op, "topk_weight");
  need(slot_of, NK, DType::i32, op, "slot_of");
  gpu::moe_combine(dt, y.data, expert_out.data, static_cast<const float*>(topk_weight.data),
                   static_cast<const int32_t*>(slot_of.data), N, C, k, stream_);
}

void CudaOps::moe_combine_backward(Tensor dexpert_out, Tensor dtopk_weight, Tensor dy, Tensor expert_out,
                                   Tensor topk_weight, Tensor slot_of, int N, int C, int k) {
  const char* op = "moe_combine_backward";
  check_dims(op, {N, C, k});
  if (!dexpert_out && !dtopk_weight) return;
  const size_t NC = size_t(N) * C, NK = size_t(N) * k;
  const DType dt = need_act(dy, NC, op, "dy");
  need(slot_of, NK, DType::i32, op, "slot_of");
  if (dexpert_out) {
    need(dexpert_out, NK * C, dt, op, "dexpert_out");
    need(topk_weight, NK, DType::f32, op, "topk_weight");
  }
  if (dtopk_weight) {
    need(dtopk_weight, NK, DType::f32, op, "dtopk_weight");
    need(expert_out, NK * C, dt, op, "expert_out");
  }
  gpu::moe_combine_backward(dt, dexpert_out.data, static_cast<float*>(dtopk_weight.data), dy.data, expert_out.data,
                            static_cast<const float*>(topk_weight.data), static_cast<const int32_t*>(slot_of.data), N,
                            C, k, stream_);
}

// ---- loss ---------------------------------------------------------------------------------------

void CudaOps::softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int Vp, float dloss) {
  check_dims("softmax_cross_entropy", {N, V, Vp});
  check(V > 0 && V <= Vp, "CudaOps::softmax_cross_entropy: need 0 < V <= Vp, got V=" + std::to_string(V) +
                              " Vp=" + std::to_string(Vp));
  need(losses, N, DType::f32, "softmax_cross_entropy", "losses");
  const DType dt = need_act(logits, size_t(N) * Vp, "softmax_cross_entropy", "logits");
  need(targets, N, DType::i32, "softmax_cross_entropy", "targets");
  gpu::softmax_cross_entropy(dt, static_cast<float*>(losses.data), logits.data,
                             static_cast<const int32_t*>(targets.data), N, V, Vp, dloss, stream_);
}

// ---- optimizer and reductions ------------------------------------------------------------------------

void CudaOps::cross_entropy_shard_stats(Tensor stats, Tensor logits, Tensor targets, int N, int Vl, int V,
                                        int vocab_start) {
  const char* op = "cross_entropy_shard_stats";
  check_dims(op, {N, Vl, V, vocab_start});
  check(V > 0, where(op) + ": the vocabulary size must be positive");
  need(stats, size_t(N) * 3, DType::f32, op, "stats");
  const DType dt = need_act(logits, size_t(N) * Vl, op, "logits");
  need(targets, N, DType::i32, op, "targets");
  gpu::cross_entropy_shard_stats(dt, static_cast<float*>(stats.data), logits.data,
                                 static_cast<const int32_t*>(targets.data), N, Vl, V, vocab_start, stream_);
}

void CudaOps::cross_entropy_shard_finish(Tensor losses, Tensor logits, Tensor targets, Tensor all_stats, int shards,
                                         int N, int Vl, int V, int vocab_start, float dloss) {
  const char* op = "cross_entropy_shard_finish";
  check_dims(op, {N, Vl, V, vocab_start});
  check(V > 0 && shards >= 1, where(op) + ": need V > 0 and at least one shard");
  need(losses, N, DType::f32, op, "losses");
  const DType dt = need_act(logits, size_t(N) * Vl, op, "logits");
  need(targets, N, DType::i32, op, "targets");
  need(all_stats, size_t(shards) * N * 3, DType::f32, op, "all_stats");
  gpu::cross_entropy_shard_finish(dt, static_cast<float*>(losses.data), logits.data,
                                  static_cast<const int32_t*>(targets.data), static_cast<const float*>(all_stats.data),
                                  shards, N, Vl, V, vocab_start, dloss, stream_);
}

void CudaOps::adamw_update(Tensor params, Tensor master, Tensor grad, Tensor m, Tensor v, size_t n, float lr,
                           float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale) {
  check(t >= 1, "CudaOps::adamw_update: step t=" + std::to_string(t) + " must be >= 1 (bias correction)");
  need(master, n, DType::f32, "adamw_update", "master");
  need(grad, n, DType::f32, "adamw_update", "grad");
  need(m, n, DType::f32, "adamw_update", "m");
  need(v, n, DType::f32, "adamw_update", "v");
  if (params) need_act(params, n, "adamw_update", "params");
  // The same bias corrections as CpuOps: in double, then rounded once.
  const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
  gpu::adamw_update(params.dtype, params.data, static_cast<float*>(master.data), static_cast<const float*>(grad.data),
                    static_cast<float*>(m.data), static_cast<float*>(v.data), n, lr, beta1, beta2, eps, weight_decay,
                    c1, c2, grad_scale, stream_);
}

double CudaOps::reduce(Tensor x, size_t n, bool square, const char* op) {
  const DType dt = need_act(x, n, op, "x");
  gpu::reduce_sum(dt, result_, x.data, n, square, scratch(gpu::reduce_scratch_bytes()), stream_);
  double host = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&host, result_, sizeof host, cudaMemcpyDeviceToHost, as_stream(stream_)));
  CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
  return host;
}

double CudaOps::sum_squares(Tensor x, size_t n) { return reduce(x, n, true, "sum_squares"); }

double CudaOps::sum(Tensor x, size_t n) { return reduce(x, n, false, "sum"); }

}  // namespace pt
