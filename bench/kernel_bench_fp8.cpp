// kernel_bench's FP8 rows (precision.fp8, issue #35), in the model's table as comparison rows (0
// calls per step: the step model stays bf16's):
//  - the casts over the fc activation [N, 4C] (bf16): fp8_amax (whole, per row, per column),
//    fp8_quantize to e4m3 plain and transposed, tensorwise and rowwise (per-row scales), and
//    tensorwise recording the amax as it reads x (delayed scaling's record_amax: the same bytes,
//    plus one atomic per block, fewer once the record holds the max), and the codes decoded back
//    to bf16 (ZeRO-3's FP8 weight gather), judged against the copy bandwidth like every
//    memory-bound op;
//  - the FP8 products at GPT-2's four block shapes (qkv, attention projection, fc, fc projection),
//    each next to the bf16 matmul_forward at the same shape: forward (e4m3 x e4m3 -> bf16, bias),
//    input gradient (dout e5m2 x w^T e4m3 -> bf16) and weight gradient (dout^T e5m2 x inp^T e4m3,
//    += f32), as core/parallel/fp8_linear.cpp calls them. Their "% ceil" is of the measured bf16
//    matmul rate: FP8's peak is twice bf16's, so up to ~200% is possible.
// On a GPU without FP8 tensor cores (Ops::supports_fp8() false) only the casts are timed.
#include <cstdio>
#include <string>

#include "bench/kernel_bench.h"

namespace pt::kernel_bench {

void bench_fp8(Bench& b, Ops& ops, const ModelShape& m) {
  const std::string sec = m.name;
  const int N = m.B * m.T, C = m.C, F = 4 * C;
  const DType bf = ops.compute_dtype(), f32 = DType::f32, e4m3 = DType::f8e4m3, e5m2 = DType::f8e5m2;
  const double s = static_cast<double>(dtype_size(bf));
  Buffers buf(ops);

  // ---- the casts
  {
    const size_t n = size_t(N) * F;
    const std::string shape = "n=N*4C=" + std::to_string(n);
    Tensor x = buf.rand(n, bf, 2), amax = buf.zeros(1, f32), sinv = buf.zeros(1, f32), q = buf.zeros(n, e4m3);
    Tensor amax_rows = buf.zeros(N, f32), amax_cols = buf.zeros(F, f32), sinv_rows = buf.zeros(N, f32),
           sinv_cols = buf.zeros(F, f32), record = buf.zeros(1, f32);
    b.run({sec, "fp8_amax", shape, false, n * s, "ns", 0}, [&] { ops.fp8_amax(amax, x, N, F, Fp8Amax::tensor); });
    b.run({sec, "fp8_amax rows", shape, false, n * s, "ns", 0},
          [&] { ops.fp8_amax(amax_rows, x, N, F, Fp8Amax::rows); });
    b.run({sec, "fp8_amax cols", shape, false, n * s, "ns", 0},
          [&] { ops.fp8_amax(amax_cols, x, N, F, Fp8Amax::cols); });
    b.run({sec, "fp8_quantize e4m3", shape, false, n * (s + 1), "n(s+1)", 0},
          [&] { ops.fp8_quantize(q, sinv, x, amax, 1, N, F, false, false, Tensor{}); });
    b.run({sec, "fp8_quantize e4m3, transposed", shape, false, n * (s + 1), "n(s+1)", 0},
          [&] { ops.fp8_quantize(q, sinv, x, amax, 1, N, F, true, false, Tensor{}); });
    // The record accumulates across the repetitions, as across a step's calls.
    b.run({sec, "fp8_quantize e4m3 + record amax", shape, false, n * (s + 1), "n(s+1)", 0},
          [&] { ops.fp8_quantize(q, sinv, x, amax, 1, N, F, false, false, record); });
    b.run({sec, "fp8_quantize e4m3 + record amax, transposed", shape, false, n * (s + 1), "n(s+1)", 0},
          [&] { ops.fp8_quantize(q, sinv, x, amax, 1, N, F, true, false, record); });
    b.run({sec, "fp8_quantize e4m3, rowwise", shape, false, n * (s + 1), "n(s+1)", 0},
          [&] { ops.fp8_quantize(q, sinv_rows, x, amax_rows, 1, N, F, false, true, Tensor{}); });
    b.run({sec, "fp8_quantize e4m3, transposed rowwise", shape, false, n * (s + 1), "n(s+1)", 0},
          [&] { ops.fp8_quantize(q, sinv_cols, x, amax_cols, 1, N, F, true, true, Tensor{}); });
    // ZeRO-3's FP8 weight gather decodes what it gathered (last: it overwrites x).
    b.run({sec, "fp8_dequantize e4m3", shape, false, n * (s + 1), "n(s+1)", 0},
          [&] { ops.fp8_dequantize(x, q, sinv, n); });
  }
  buf.clear();
  if (!ops.supports_fp8()) {
    std::fprintf(stderr, "  (no FP8 tensor cores on %s: the FP8 products are not timed)\n",
                 ops.device_description().c_str());
    return;
  }

  // ---- the products, beside bf16's
  struct Mm {
    const char* name;
    int IC, OC;
  };
  const Mm mms[] = {{"qkv", C, 3 * C}, {"attn proj", C, C}, {"fc", C, F}, {"fc proj", F, C}};
  for (const Mm& mm : mms) {
    const int IC = mm.IC, OC = mm.OC;
    const std::string shape = "N=" + std::to_string(N) + " IC=" + std::to_string(IC) + " OC=" + std::to_string(OC);
    const size_t NI = size_t(N) * IC, NO = size_t(N) * OC, W = size_t(OC) * IC;
    Tensor inp = buf.rand(NI, bf, 1), w = buf.rand(W, bf, 0.02f), bias = buf.rand(OC, bf, 0.02f);
    Tensor dout = buf.rand(NO, bf, 1e-3f), out = buf.zeros(NO, bf), dinp = buf.zeros(NI, bf), dw = buf.zeros(W, f32);
    // The operands as fp8_linear quantises them: [rows, K] with K the contraction.
    // amax and scale_inv per operand, each in its own 16 bytes: cuBLASLt refuses a scale pointer
    // that is not 16-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED), as fp8_linear's slots know.
    Tensor scales = buf.zeros(6 * 8, f32);
    struct Fp8 {
      Tensor q, sinv;
    };
    auto quantised = [&](Tensor x, int rows, int cols, bool transpose, DType fmt, int slot) {
      Fp8 r{buf.zeros(size_t(rows) * cols, fmt), scales.slice(8 * slot + 4, 1)};
      Tensor amax = scales.slice(8 * slot, 1);
      ops.fp8_amax(amax, x, rows, cols, Fp8Amax::tensor);
      ops.fp8_quantize(r.q, r.sinv, x, amax, 1, rows, cols, transpose, false, Tensor{});
      return r;
    };
    const Fp8 i8 = quantised(inp, N, IC, false, e4m3, 0);    // [N, IC]
    const Fp8 w8 = quantised(w, OC, IC, false, e4m3, 1);     // [OC, IC]
    const Fp8 wt8 = quantised(w, OC, IC, true, e4m3, 2);     // w^T [IC, OC]
    const Fp8 d8 = quantised(dout, N, OC, false, e5m2, 3);   // [N, OC]
    const Fp8 dt8 = quantised(dout, N, OC, true, e5m2, 4);   // dout^T [OC, N]
    const Fp8 it8 = quantised(inp, N, IC, true, e4m3, 5);    // inp^T [IC, N]
    const double fl = 2.0 * N * IC * OC;
    const std::string name = mm.name;
    b.run({sec, "matmul_forward " + name + " (bf16, beside fp8)", shape, true, fl, "2*N*IC*OC", 0},
          [&] { ops.matmul_forward(out, inp, w, bias, N, IC, OC); });
    b.run({sec, "fp8_matmul " + name + " forward (e4m3)", shape, true, fl, "2*N*IC*OC", 0},
          [&] { ops.fp8_matmul(out, i8.q, i8.sinv, w8.q, w8.sinv, bias, N, OC, IC, false, false); });
    b.run({sec, "fp8_matmul " + name + " dinp (e5m2 x e4m3)", shape, true, fl, "2*N*IC*OC", 0},
          [&] { ops.fp8_matmul(dinp, d8.q, d8.sinv, wt8.q, wt8.sinv, Tensor{}, N, IC, OC, false, false); });
    b.run({sec, "fp8_matmul " + name + " dW += (e5m2 x e4m3, f32)", shape, true, fl, "2*N*IC*OC", 0},
          [&] { ops.fp8_matmul(dw, dt8.q, dt8.sinv, it8.q, it8.sinv, Tensor{}, OC, IC, N, true, false); });
    buf.clear();
  }
}

}  // namespace pt::kernel_bench
