// FP8 linear layers on the CPU: the exact emulation of CudaOps' FP8 path (Ops, "FP8 linear
// layers"). Quantisation is core/common/fp8.h's rounding, the code the GPU's cast kernels run,
// so the codes and scales match bit for bit; a product decodes its operands to floats (every
// FP8 value is one, and every product of two is exact in fp32) and runs the reference GEMM, so
// it differs from the GPU's tensor cores only in the order of its fp32 sum.
// Bytes: amax reads n elements; quantise reads n and writes n bytes (rowwise: plus a scale a
// row); the product decodes
// M*K + N*K codes into fp32 scratch and is then the reference GEMM (2*M*N*K FLOPs).
#include <algorithm>
#include <array>
#include <vector>

#include "core/common/fp8.h"
#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/cpu_ops.h"
#include "core/cpu/cpu_parallel.h"

namespace pt {

namespace {

Fp8Format fp8_format_of(const Tensor& t, const char* op, const char* name) {
  check(t.dtype == DType::f8e4m3 || t.dtype == DType::f8e5m2, std::string("CpuOps::") + op + ": " + name + " is " +
                                                                  dtype_name(t.dtype) + ", expected f8e4m3 or f8e5m2");
  return t.dtype == DType::f8e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
}

const uint8_t* fp8_arg(const Tensor& t, size_t n, const char* op, const char* name) {
  check(t.data != nullptr || n == 0, std::string("CpuOps::") + op + ": " + name + " is null");
  fp8_format_of(t, op, name);
  cpu::check_size(t, n, op, name);
  return static_cast<const uint8_t*>(t.data);
}

// Every code's value, per format.
const std::array<float, 256>& decode_table(Fp8Format f) {
  static const auto make = [](Fp8Format fmt) {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; c++) t[c] = fp8_decode(static_cast<uint8_t>(c), fmt);
    return t;
  };
  static const std::array<float, 256> e4m3 = make(Fp8Format::e4m3), e5m2 = make(Fp8Format::e5m2);
  return f == Fp8Format::e4m3 ? e4m3 : e5m2;
}

void decode(std::vector<float>& out, const uint8_t* codes, size_t n, Fp8Format f) {
  const float* table = decode_table(f).data();
  out.resize(n);
  float* values = out.data();
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < static_cast<long long>(n); i++) values[i] = table[codes[i]];
}

}  // namespace

bool CpuOps::supports_fp8() const { return true; }

void CpuOps::fp8_amax(Tensor amax, Tensor x, int rows, int cols, Fp8Amax over) {
  cpu::check_dims("fp8_amax", {rows, cols});
  const size_t count = over == Fp8Amax::tensor ? 1 : over == Fp8Amax::rows ? size_t(rows) : size_t(cols);
  float* out = cpu::f32_arg(amax, count, "fp8_amax", "amax");
  const float* in = cpu::f32_arg(x, size_t(rows) * cols, "fp8_amax", "x");
  if (over == Fp8Amax::tensor) {
    uint32_t largest = 0;
#pragma omp parallel for reduction(max : largest) schedule(static)
    for (long long i = 0; i < static_cast<long long>(size_t(rows) * cols); i++)
      largest = std::max(largest, fp8_magnitude_bits(in[i]));
    out[0] = fp8_bits_float(largest);
    return;
  }
  if (over == Fp8Amax::rows) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
      uint32_t largest = 0;
      for (int c = 0; c < cols; c++) largest = std::max(largest, fp8_magnitude_bits(in[size_t(r) * cols + c]));
      out[r] = fp8_bits_float(largest);
    }
    return;
  }
  // Columns: each thread a block of columns, walking the rows (contiguous reads per row).
  cpu::for_each_channel_block(cols, [&](int c0, int c1) {
    uint32_t largest[cpu::kChannelBlock] = {};
    for (int r = 0; r < rows; r++)
      for (int c = c0; c < c1; c++) largest[c - c0] = std::max(largest[c - c0], fp8_magnitude_bits(in[size_t(r) * cols + c]));
    for (int c = c0; c < c1; c++) out[c] = fp8_bits_float(largest[c - c0]);
  });
}

void CpuOps::fp8_quantize(Tensor q, Tensor scale_inv, Tensor x, Tensor amaxes, int n_amax, int rows, int cols,
                          bool transpose, bool per_row, Tensor record_amax) {
  cpu::check_dims("fp8_quantize", {n_amax, rows, cols});
  const size_t n = size_t(rows) * cols;
  const int R = transpose ? cols : rows;  // q's rows
  const size_t scales = per_row ? size_t(R) : 1;
  check(n_amax >= 1, "CpuOps::fp8_quantize: needs at least one amax");
  check(q.data != nullptr || n == 0, "CpuOps::fp8_quantize: q is null");
  const Fp8Format f = fp8_format_of(q, "fp8_quantize", "q");
  cpu::check_size(q, n, "fp8_quantize", "q");
  float* sinv = cpu::f32_arg(scale_inv, scales, "fp8_quantize", "scale_inv");
  const float* in = cpu::f32_arg(x, n, "fp8_quantize", "x");
  const float* am = cpu::f32_arg(amaxes, size_t(n_amax) * scales, "fp8_quantize", "amaxes");
  // Each scale's exponent: from the largest of its n_amax entries (one per rank's part).
  std::vector<int> k(scales);
  for (size_t i = 0; i < scales; i++) k[i] = fp8_parts_scale_exponent(am, n_amax, scales, i, f);
  const int* kp = k.data();
  uint8_t* codes = static_cast<uint8_t*>(q.data);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      // q's row of this element: x's row, or its column when transposed.
      const int qrow = transpose ? c : r;
      const float s = fp8_pow2(kp[per_row ? qrow : 0]);
      const uint8_t code = fp8_encode(in[size_t(r) * cols + c] * s, f);
      codes[transpose ? size_t(c) * rows + r : size_t(r) * cols + c] = code;
    }
  for (size_t i = 0; i < scales; i++) sinv[i] = fp8_pow2(-k[i]);
  if (record_amax) {
    check(!per_row, "CpuOps::fp8_quantize: record_amax with per-row scales (it records one tensor's amax)");
    float* rec = cpu::f32_arg(record_amax, 1, "fp8_quantize", "record_amax");
    uint32_t largest = fp8_magnitude_bits(rec[0]);
#pragma omp parallel for reduction(max : largest) schedule(static)
    for (long long i = 0; i < static_cast<long long>(n); i++) largest = std::max(largest, fp8_magnitude_bits(in[i]));
    rec[0] = fp8_bits_float(largest);
  }
}

void CpuOps::fp8_dequantize(Tensor out, Tensor q, Tensor scale_inv, size_t n) {
  const Fp8Format f = fp8_format_of(q, "fp8_dequantize", "q");
  const uint8_t* codes = fp8_arg(q, n, "fp8_dequantize", "q");
  const float s = cpu::f32_arg(scale_inv, 1, "fp8_dequantize", "scale_inv")[0];
  float* o = cpu::f32_arg(out, n, "fp8_dequantize", "out");
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < static_cast<long long>(n); i++) o[i] = fp8_decode(codes[i], f) * s;
}

void CpuOps::fp8_matmul(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor bias, int M,
                        int N, int K, bool accumulate, bool per_row) {
  cpu::check_dims("fp8_matmul", {M, N, K});
  check(!(accumulate && bias), "CpuOps::fp8_matmul: a bias with accumulate (the bias joins a fresh product only)");
  check(!(a.dtype == DType::f8e5m2 && b.dtype == DType::f8e5m2),
        "CpuOps::fp8_matmul: both operands are e5m2 (the tensor cores take at most one)");
  float* o = cpu::f32_arg(out, size_t(M) * N, "fp8_matmul", "out");
  const uint8_t* ac = fp8_arg(a, size_t(M) * K, "fp8_matmul", "a");
  const uint8_t* bc = fp8_arg(b, size_t(N) * K, "fp8_matmul", "b");
  const float* sa = cpu::f32_arg(a_scale_inv, per_row ? size_t(M) : 1, "fp8_matmul", "a_scale_inv");
  const float* sb = cpu::f32_arg(b_scale_inv, per_row ? size_t(N) : 1, "fp8_matmul", "b_scale_inv");
  const float* bs = cpu::optional_f32_arg(bias, N, "fp8_matmul", "bias");
  // Scratch kept across calls; inside the parallel loops below only through plain pointers (in
  // an OpenMP region a thread_local's name means each thread's own instance).
  thread_local std::vector<float> av, bv, acc;
  decode(av, ac, size_t(M) * K, a.dtype == DType::f8e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2);
  decode(bv, bc, size_t(N) * K, b.dtype == DType::f8e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2);
  acc.resize(size_t(M) * N);
  // acc = a @ b^T: B(k, col) = b[col, k].
  cpu::gemm(acc.data(), N, M, N, K, cpu::Strided{av.data(), K, 1}, cpu::Strided{bv.data(), 1, K}, nullptr,
            /*accumulate=*/false);
  // The scales as cuBLASLt applies them, scale_a * scale_b * sum (exact: powers of two), then
  // one rounding with the bias or the accumulated output.
  const float* sum = acc.data();
#pragma omp parallel for schedule(static)
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      const size_t at = size_t(i) * N + j;
      const float v = sum[at] * (per_row ? sa[i] * sb[j] : sa[0] * sb[0]);
      o[at] = accumulate ? o[at] + v : bs ? v + bs[j] : v;
    }
}

}  // namespace pt
