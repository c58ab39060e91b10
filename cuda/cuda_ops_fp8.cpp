// CudaOps's FP8 ops (see cuda_ops.h and Ops "FP8 linear layers"): the amax and quantisation casts
// (cuda/fp8_cast.cu, any GPU; tensorwise or per row/column) and the FP8 product (cuda/matmul_fp8.cu,
// compute capability 8.9+; its rowwise scales 9.0+).
// Each checks its arguments (cuda_ops_args.h), then calls its launcher on the backend's stream.
// Host code only, compiled by g++ against the CUDA runtime headers.
#include <cstdint>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_ops_args.h"
#include "cuda/fp8_cast.h"
#include "cuda/fp8_dequantize.h"
#include "cuda/matmul_fp8.h"

namespace pt {

using namespace cuda_ops_args;

namespace {

bool is_fp8(DType t) { return t == DType::f8e4m3 || t == DType::f8e5m2; }

// FP8 codes: n elements of f8e4m3 or f8e5m2.
void need_fp8(const Tensor& t, size_t n, const char* op, const char* name) {
  need(t, n, op, name);
  check(is_fp8(t.dtype) || (t.data == nullptr && n == 0),
        where(op) + ": " + name + " is " + dtype_name(t.dtype) + ", expected f8e4m3 or f8e5m2");
}

bool bytes_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace

void CudaOps::fp8_amax(Tensor amax, Tensor x, int rows, int cols, Fp8Amax over) {
  const char* op = "fp8_amax";
  check_dims(op, {rows, cols});
  const size_t n = size_t(rows) * cols;
  const size_t count = over == Fp8Amax::tensor ? 1 : over == Fp8Amax::rows ? size_t(rows) : size_t(cols);
  need(amax, count, DType::f32, op, "amax");
  const DType dt = need_act(x, n, op, "x");
  // The kernels read x while they write amax (the column kernel after zeroing it).
  check(!bytes_overlap(amax.data, count * sizeof(float), x.data, n * dtype_size(dt)), where(op) + ": amax overlaps x");
  gpu::fp8_amax(dt, static_cast<float*>(amax.data), x.data, rows, cols, over, stream_);
}

void CudaOps::fp8_quantize(Tensor q, Tensor scale_inv, Tensor x, Tensor amaxes, int n_amax, int rows, int cols,
                           bool transpose, bool per_row, Tensor record_amax) {
  const char* op = "fp8_quantize";
  check_dims(op, {n_amax, rows, cols});
  check(n_amax >= 1, where(op) + ": needs at least one amax");
  const size_t n = size_t(rows) * cols;
  const size_t scales = per_row ? size_t(transpose ? cols : rows) : 1;  // one per row of q, or one
  const DType dt = need_act(x, n, op, "x");
  check(is_fp8(q.dtype), where(op) + ": q is " + dtype_name(q.dtype) + ", expected f8e4m3 or f8e5m2");
  need(q, n, op, "q");
  // An empty per-row q has no scales: scale_inv and amaxes may then be empty too.
  if (scales > 0) {
    need(scale_inv, scales, DType::f32, op, "scale_inv");
    need(amaxes, size_t(n_amax) * scales, DType::f32, op, "amaxes");
  }
  // Every block reads x and amaxes while others write q and scale_inv.
  const size_t sbytes = scales * sizeof(float);
  check(!bytes_overlap(q.data, n, x.data, n * dtype_size(dt)), where(op) + ": q overlaps x");
  check(!bytes_overlap(q.data, n, amaxes.data, size_t(n_amax) * sbytes), where(op) + ": q overlaps amaxes");
  check(!bytes_overlap(scale_inv.data, sbytes, amaxes.data, size_t(n_amax) * sbytes) &&
            !bytes_overlap(scale_inv.data, sbytes, x.data, n * dtype_size(dt)) &&
            !bytes_overlap(scale_inv.data, sbytes, q.data, n),
        where(op) + ": scale_inv overlaps amaxes, x or q");
  // record_amax: one f32, raised by the cast kernel's atomics while it reads x and amaxes and
  // writes q and scale_inv.
  if (record_amax) {
    check(!per_row, where(op) + ": record_amax with per-row scales (it records one tensor's amax)");
    need(record_amax, 1, DType::f32, op, "record_amax");
    const void* rec = record_amax.data;
    check(!bytes_overlap(rec, sizeof(float), q.data, n) && !bytes_overlap(rec, sizeof(float), scale_inv.data, sbytes) &&
              !bytes_overlap(rec, sizeof(float), x.data, n * dtype_size(dt)) &&
              !bytes_overlap(rec, sizeof(float), amaxes.data, size_t(n_amax) * sbytes),
          where(op) + ": record_amax overlaps q, scale_inv, x or amaxes");
  }
  if (scales == 0) return;
  gpu::fp8_quantize(dt, q.dtype, q.data, static_cast<float*>(scale_inv.data), x.data,
                    static_cast<const float*>(amaxes.data), n_amax, rows, cols, transpose, per_row,
                    static_cast<float*>(record_amax.data), stream_);
}

void CudaOps::fp8_dequantize(Tensor out, Tensor q, Tensor scale_inv, size_t n) {
  const char* op = "fp8_dequantize";
  check(is_fp8(q.dtype), where(op) + ": q is " + dtype_name(q.dtype) + ", expected f8e4m3 or f8e5m2");
  need(q, n, op, "q");
  const DType dt = need_act(out, n, op, "out");
  need(scale_inv, 1, DType::f32, op, "scale_inv");
  check(!bytes_overlap(out.data, n * dtype_size(dt), q.data, n), where(op) + ": out overlaps q");
  gpu::fp8_dequantize(dt, out.data, q.dtype, q.data, static_cast<const float*>(scale_inv.data), n, stream_);
}

void CudaOps::fp8_matmul(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor bias, int M,
                         int N, int K, bool accumulate, bool per_row) {
  const char* op = "fp8_matmul";
  check(fp8_, where(op) + ": FP8 needs compute capability 8.9+ (Ada, Hopper or newer); this GPU is " + description_ +
                  " (Ops::supports_fp8() says so before a run starts)");
  check_dims(op, {M, N, K});
  check(!(accumulate && bias), where(op) + ": a bias with accumulate (the bias joins a fresh product only)");
  need_fp8(a, size_t(M) * K, op, "a");
  need_fp8(b, size_t(N) * K, op, "b");
  check(!(a.dtype == DType::f8e5m2 && b.dtype == DType::f8e5m2),
        where(op) + ": both operands are f8e5m2 (the tensor cores take at most one)");
  if (per_row) {
    // cuBLASLt's outer-vector scale mode (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) has kernels
    // for Hopper (9.0) and later only; Ada (8.9) runs tensorwise products only.
    check(fp8_rowwise_, where(op) + ": rowwise FP8 products (cuBLASLt outer-vector scales) need compute capability "
                                    "9.0+ (Hopper or newer) and cuBLAS 12.9+; this GPU is " + description_);
    if (M > 0) need(a_scale_inv, size_t(M), DType::f32, op, "a_scale_inv");
    if (N > 0) need(b_scale_inv, size_t(N), DType::f32, op, "b_scale_inv");
  } else {
    need(a_scale_inv, 1, DType::f32, op, "a_scale_inv");
    need(b_scale_inv, 1, DType::f32, op, "b_scale_inv");
  }
  const DType od = need_act(out, size_t(M) * N, op, "out");
  if (bias) need(bias, N, od, op, "bias");
  gpu::matmul_fp8(matmul_, a.dtype, b.dtype, od, out.data, a.data, static_cast<const float*>(a_scale_inv.data),
                  b.data, static_cast<const float*>(b_scale_inv.data), bias.data, M, N, K, accumulate, per_row,
                  stream_);
}

}  // namespace pt
