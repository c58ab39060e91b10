// FP8 (precision.fp8): the two formats' rounding (core/common/fp8.h) against NVIDIA's own
// host-side conversions and against values read off the formats' definitions, the power-of-two
// scales, CpuOps' FP8 ops, the FP8 linear layer against the same product done by hand, and the
// config keys. Delayed scaling's state is test_fp8_delayed.cpp's.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/common/fp8.h"
#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
#include "core/dist/local_comm.h"
#include "core/parallel/fp8_linear.h"
#include "cpu_test_support.h"
#include "relative_error.h"

#ifdef PICOTRAIN_HAVE_CUDA_FP8_H
#include <cuda_fp8.h>
#endif

using namespace pt;
using namespace pt::test;

namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::e4m3, Fp8Format::e5m2};

// Every finite value of a format from its definition alone (sign, exponent, mantissa fields),
// in code order, with NaN for NaN codes and +-inf for e5m2's infinities.
float value_by_definition(int code, Fp8Format f) {
  const int m = f == Fp8Format::e4m3 ? 3 : 2, e_bits = f == Fp8Format::e4m3 ? 4 : 5;
  const int bias = (1 << (e_bits - 1)) - 1;
  const int sign = code >> 7, exp = (code >> m) & ((1 << e_bits) - 1), mant = code & ((1 << m) - 1);
  const double s = sign ? -1.0 : 1.0;
  if (f == Fp8Format::e4m3 && exp == 15 && mant == 7) return std::numeric_limits<float>::quiet_NaN();
  if (f == Fp8Format::e5m2 && exp == 31)
    return mant ? std::numeric_limits<float>::quiet_NaN() : float(s * std::numeric_limits<double>::infinity());
  if (exp == 0) return float(s * std::ldexp(double(mant), 1 - bias - m));
  return float(s * std::ldexp(1.0 + double(mant) / (1 << m), exp - bias));
}

bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)); }

// The floats where rounding decides: every value, the midpoints between neighbours, one float
// either side of each, beyond the largest value, the subnormal range, and the specials.
std::vector<float> rounding_probes(Fp8Format f) {
  std::vector<float> finite;
  for (int c = 0; c < 128; c++) {
    const float v = value_by_definition(c, f);
    if (std::isfinite(v)) finite.push_back(v);
  }
  std::vector<float> probes;
  const auto around = [&](float x) {
    for (float s : {1.0f, -1.0f}) {
      probes.push_back(s * x);
      probes.push_back(s * std::nextafter(x, 0.0f));
      probes.push_back(s * std::nextafter(x, std::numeric_limits<float>::infinity()));
    }
  };
  for (size_t i = 0; i < finite.size(); i++) {
    around(finite[i]);
    if (i + 1 < finite.size()) around(0.5f * (finite[i] + finite[i + 1]));  // exact: neighbours differ in one bit
  }
  const float max = fp8_max_value(f);
  for (float x : {max * 1.03125f, max * 1.0625f, max * 1.5f, max * 4.0f, 1e30f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(), 1e-30f, 0.0f})
    around(x);
  probes.push_back(std::numeric_limits<float>::quiet_NaN());
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> log_mag(-30.0f, 20.0f);
  for (int i = 0; i < 200000; i++) probes.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(log_mag(gen)));
  return probes;
}

}  // namespace

TEST_CASE("fp8_decode gives every code's value as the formats define it", "[fp8]") {
  for (Fp8Format f : kFormats) {
    INFO(fp8_format_name(f));
    for (int c = 0; c < 256; c++) {
      INFO("code 0x" << std::hex << c);
      CHECK(same_value(fp8_decode(uint8_t(c), f), value_by_definition(c, f)));
    }
  }
  // The landmarks the formats are known by.
  CHECK(fp8_decode(0x7e, Fp8Format::e4m3) == 448.0f);
  CHECK(fp8_decode(0x01, Fp8Format::e4m3) == std::ldexp(1.0f, -9));
  CHECK(fp8_decode(0x08, Fp8Format::e4m3) == std::ldexp(1.0f, -6));
  CHECK(std::isnan(fp8_decode(0x7f, Fp8Format::e4m3)));
  CHECK(fp8_decode(0x7b, Fp8Format::e5m2) == 57344.0f);
  CHECK(fp8_decode(0x01, Fp8Format::e5m2) == std::ldexp(1.0f, -16));
  CHECK(std::isinf(fp8_decode(0x7c, Fp8Format::e5m2)));
  CHECK(fp8_decode(0x38, Fp8Format::e4m3) == 1.0f);
  CHECK(fp8_decode(0x3c, Fp8Format::e5m2) == 1.0f);
}

TEST_CASE("fp8_encode rounds to nearest even and saturates", "[fp8]") {
  for (Fp8Format f : kFormats) {
    INFO(fp8_format_name(f));
    // Every code's value encodes back to that code (NaN codes to the canonical NaN).
    for (int c = 0; c < 256; c++) {
      const float v = fp8_decode(uint8_t(c), f);
      if (std::isfinite(v)) CHECK(fp8_encode(v, f) == c);
    }
    // Against the definition: the nearest value by distance, ties to the even code, beyond
    // the largest finite value its sign's largest, NaN stays NaN.
    for (float x : rounding_probes(f)) {
      INFO("x = " << x);
      const uint8_t got = fp8_encode(x, f);
      if (std::isnan(x)) {
        CHECK(std::isnan(fp8_decode(got, f)));
        continue;
      }
      if (std::fabs(x) >= fp8_max_value(f)) {  // beyond the range: its sign's largest finite value
        CHECK(got == ((std::signbit(x) ? 0x80 : 0) | fp8_max_code(f)));
        continue;
      }
      int best = -1;
      double best_d = 0;
      for (int c = 0; c < 256; c++) {
        const float v = value_by_definition(c, f);
        if (!std::isfinite(v) || std::signbit(v) != std::signbit(x)) continue;  // rounding keeps the sign
        const double d = std::fabs(double(v) - double(x));
        if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
      }
      CHECK(got == best);
    }
  }
}

#ifdef PICOTRAIN_HAVE_CUDA_FP8_H
TEST_CASE("fp8_encode and fp8_decode agree with NVIDIA's conversions (cuda_fp8.h)", "[fp8]") {
  for (Fp8Format f : kFormats) {
    INFO(fp8_format_name(f));
    const __nv_fp8_interpretation_t nv = f == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2;
    for (int c = 0; c < 256; c++) {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), nv);
      __half half;
      std::memcpy(&half, &h, sizeof half);
      INFO("code 0x" << std::hex << c);
      CHECK(same_value(fp8_decode(uint8_t(c), f), __half2float(half)));
    }
    size_t differ = 0;
    for (float x : rounding_probes(f)) {
      const uint8_t want = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, nv);
      const uint8_t got = fp8_encode(x, f);
      // NaN: any NaN code is a NaN.
      const bool same = got == want || (std::isnan(fp8_decode(got, f)) && std::isnan(fp8_decode(want, f)));
      if (!same && differ++ < 10) FAIL_CHECK("x = " << x << ": ours 0x" << std::hex << int(got) << ", NVIDIA's 0x" << int(want));
    }
    CHECK(differ == 0);
  }
}
#endif

TEST_CASE("the scale is the largest power of two that keeps amax in range", "[fp8]") {
  for (Fp8Format f : kFormats) {
    INFO(fp8_format_name(f));
    const float max = fp8_max_value(f);
    std::mt19937 gen(3);
    std::uniform_real_distribution<float> log_mag(-100.0f, 100.0f);
    for (int i = 0; i < 20000; i++) {
      const float amax = std::exp2(log_mag(gen));
      const int k = fp8_scale_exponent(amax, f);
      INFO("amax " << amax << " k " << k);
      CHECK(double(amax) * std::ldexp(1.0, k) <= max);
      CHECK(double(amax) * std::ldexp(1.0, k + 1) > max);
    }
    CHECK(fp8_scale_exponent(max, f) == 0);
    CHECK(fp8_scale_exponent(std::nextafter(max, 1e30f), f) == -1);
    CHECK(fp8_scale_exponent(1.0f, f) == (f == Fp8Format::e4m3 ? 8 : 15));
    CHECK(fp8_scale_exponent(0.0f, f) == 0);
    CHECK(fp8_scale_exponent(std::numeric_limits<float>::quiet_NaN(), f) == 0);
    CHECK(fp8_scale_exponent(std::numeric_limits<float>::infinity(), f) == 0);
    CHECK(fp8_scale_exponent(1e-40f, f) == 126);  // a float subnormal: clamped
    CHECK(fp8_scale_exponent(std::ldexp(1.0f, 100), f) == (f == Fp8Format::e4m3 ? 8 : 15) - 100);
    CHECK(fp8_scale_exponent(std::ldexp(1.875f, 100), f) == (f == Fp8Format::e4m3 ? 8 : 15) - 101);
  }
}

TEST_CASE("CpuOps quantises with the whole tensor's scale, plain and transposed", "[fp8]") {
  CpuOps ops;
  Buffers buf(ops);
  const int rows = 5, cols = 7;
  std::vector<float> x = random_floats(size_t(rows) * cols, 1, -3.0f, 3.0f);
  x[4] = -5.5f;  // this part's amax
  const Tensor xt = buf.f32(x);
  const Tensor amaxes = buf.zeros(3);
  ops.fp8_amax(amaxes.slice(1, 1), xt, rows, cols, Fp8Amax::tensor);
  CHECK(buf.read(amaxes)[1] == 5.5f);
  // Two other ranks' parts: the largest, 20, sets the scale: 2^4 (20 * 16 = 320 <= 448 < 640).
  const float others[] = {20.0f, 0.25f};
  ops.upload(amaxes.slice(0, 1), &others[0], DType::f32, 1);
  ops.upload(amaxes.slice(2, 1), &others[1], DType::f32, 1);
  for (bool transpose : {false, true}) {
    for (Fp8Format f : kFormats) {
      INFO((transpose ? "transposed " : "plain ") << fp8_format_name(f));
      const Tensor q = buf.zeros(x.size(), f == Fp8Format::e4m3 ? DType::f8e4m3 : DType::f8e5m2);
      const Tensor sinv = buf.zeros(1);
      ops.fp8_quantize(q, sinv, xt, amaxes, 3, rows, cols, transpose, false, Tensor{});
      const int k = fp8_scale_exponent(20.0f, f);
      CHECK(buf.read(sinv)[0] == std::ldexp(1.0f, -k));
      const uint8_t* codes = static_cast<const uint8_t*>(q.data);
      for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
          const size_t at = transpose ? size_t(c) * rows + r : size_t(r) * cols + c;
          CHECK(codes[at] == fp8_encode(std::ldexp(x[size_t(r) * cols + c], k), f));
        }
    }
  }
  // A NaN makes the amax a NaN (the largest bit pattern).
  x[3] = std::numeric_limits<float>::quiet_NaN();
  ops.fp8_amax(amaxes.slice(0, 1), buf.f32(x), rows, cols, Fp8Amax::tensor);
  CHECK(std::isnan(buf.read(amaxes)[0]));
}

TEST_CASE("CpuOps quantises rowwise: each row of the operand with its own scale, over every part", "[fp8]") {
  CpuOps ops;
  Buffers buf(ops);
  const int rows = 6, cols = 9, parts = 3;
  std::vector<float> x = random_floats(size_t(rows) * cols, 2, -3.0f, 3.0f);
  for (int r = 0; r < rows; r++) x[size_t(r) * cols + r] = std::ldexp(1.5f, r - 3);  // rows of different sizes
  const Tensor xt = buf.f32(x);
  // Per row and per column, against a plain loop.
  for (Fp8Amax over : {Fp8Amax::rows, Fp8Amax::cols}) {
    const int len = over == Fp8Amax::rows ? rows : cols;
    const Tensor amax = buf.zeros(len);
    ops.fp8_amax(amax, xt, rows, cols, over);
    const std::vector<float> got = buf.read(amax);
    for (int i = 0; i < len; i++) {
      float want = 0;
      for (int j = 0; j < (over == Fp8Amax::rows ? cols : rows); j++)
        want = std::max(want, std::fabs(over == Fp8Amax::rows ? x[size_t(i) * cols + j] : x[size_t(j) * cols + i]));
      CHECK(got[i] == want);
    }
  }
  for (bool transpose : {false, true}) {
    INFO((transpose ? "transposed" : "plain"));
    const int R = transpose ? cols : rows;  // the operand's rows, each with its own scale
    // Three parts' amaxes per operand row, as Fp8Linear gathers them: this rank's, and two others'.
    const Tensor amaxes = buf.zeros(size_t(parts) * R);
    ops.fp8_amax(amaxes.slice(R, R), xt, rows, cols, transpose ? Fp8Amax::cols : Fp8Amax::rows);
    std::vector<float> others = random_floats(size_t(2) * R, 3, 0.0f, 4.0f);
    ops.upload(amaxes.slice(0, R), others.data(), DType::f32, R);
    ops.upload(amaxes.slice(2 * size_t(R), R), others.data() + R, DType::f32, R);
    const std::vector<float> all = buf.read(amaxes);
    const Tensor q = buf.zeros(x.size(), DType::f8e4m3), sinv = buf.zeros(R);
    ops.fp8_quantize(q, sinv, xt, amaxes, parts, rows, cols, transpose, true, Tensor{});
    const std::vector<float> scale_inv = buf.read(sinv);
    const uint8_t* codes = static_cast<const uint8_t*>(q.data);
    for (int i = 0; i < R; i++) {
      const float amax = std::max({all[i], all[R + i], all[2 * size_t(R) + i]});
      const int k = fp8_scale_exponent(amax, Fp8Format::e4m3);
      CHECK(scale_inv[i] == std::ldexp(1.0f, -k));
      for (int j = 0; j < (transpose ? rows : cols); j++) {
        const float v = transpose ? x[size_t(j) * cols + i] : x[size_t(i) * (cols) + j];
        CHECK(codes[size_t(i) * (transpose ? rows : cols) + j] == fp8_encode(std::ldexp(v, k), Fp8Format::e4m3));
      }
    }
  }
}

TEST_CASE("CpuOps' FP8 product is the exact product of the decoded operands, rescaled", "[fp8]") {
  CpuOps ops;
  Buffers buf(ops);
  const int M = 9, N = 6, K = 13;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> code(0, 255);
  const Tensor a = buf.zeros(size_t(M) * K, DType::f8e5m2), b = buf.zeros(size_t(N) * K, DType::f8e4m3);
  auto* ac = static_cast<uint8_t*>(a.data);
  auto* bc = static_cast<uint8_t*>(b.data);
  // Codes of magnitude 0 or in [1/16, 4]: every product then lies on a grid of 2^-14 below 16,
  // so every sum of 13 is exact in float as in double, whatever its order.
  const auto pick = [&](Fp8Format f) {
    for (;;) {
      const uint8_t c = uint8_t(code(gen));
      const float v = std::fabs(fp8_decode(c, f));
      if (v == 0 || (v >= 0.0625f && v <= 4)) return c;
    }
  };
  for (size_t i = 0; i < a.numel; i++) ac[i] = pick(Fp8Format::e5m2);
  for (size_t i = 0; i < b.numel; i++) bc[i] = pick(Fp8Format::e4m3);
  const float sa_v = 0.25f, sb_v = 8.0f;
  const Tensor sa = buf.f32({sa_v}), sb = buf.f32({sb_v});
  const std::vector<float> bias = random_floats(N, 2);
  const Tensor out = buf.f32(std::vector<float>(size_t(M) * N, 1.0f));
  std::vector<float> want(size_t(M) * N);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int k = 0; k < K; k++)
        s += double(fp8_decode(ac[size_t(i) * K + k], Fp8Format::e5m2)) * fp8_decode(bc[size_t(j) * K + k], Fp8Format::e4m3);
      want[size_t(i) * N + j] = float(s) * (sa_v * sb_v);
    }
  ops.fp8_matmul(out, a, sa, b, sb, buf.f32(bias), M, N, K, false, false);
  std::vector<float> got = buf.read(out);
  for (size_t i = 0; i < got.size(); i++) CHECK(got[i] == want[i] + bias[i % N]);
  ops.fp8_matmul(out, a, sa, b, sb, Tensor{}, M, N, K, true, false);  // += the product
  const std::vector<float> twice = buf.read(out);
  for (size_t i = 0; i < got.size(); i++) CHECK(twice[i] == got[i] + want[i]);
  // Both e5m2: refused, as the tensor cores refuse it.
  const Tensor a2 = buf.zeros(size_t(N) * K, DType::f8e5m2);
  CHECK_THROWS_WITH(ops.fp8_matmul(out, a, sa, a2, sb, Tensor{}, M, N, K, false, false),
                    Catch::Contains("both operands are e5m2"));
  // Rowwise: a scale per row of a and per row of b (powers of two: still exact).
  std::vector<float> ra(M), rb(N);
  for (int i = 0; i < M; i++) ra[i] = std::ldexp(1.0f, i % 5 - 2);
  for (int j = 0; j < N; j++) rb[j] = std::ldexp(1.0f, 3 - j % 4);
  ops.fp8_matmul(out, a, buf.f32(ra), b, buf.f32(rb), buf.f32(bias), M, N, K, false, true);
  const std::vector<float> rowwise = buf.read(out);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      const size_t at = size_t(i) * N + j;
      CHECK(rowwise[at] == want[at] / (sa_v * sb_v) * (ra[i] * rb[j]) + bias[j]);
    }
}

TEST_CASE("the FP8 linear layer is the product of the quantised operands, forward and backward", "[fp8]") {
  CpuOps ops;
  Buffers buf(ops);
  LocalComm tp(0, ops);
  const int N = 12, IC = 10, OC = 6;
  std::vector<float> x = random_floats(size_t(N) * IC, 11, -2, 2), w = random_floats(size_t(OC) * IC, 12, -0.3f, 0.3f);
  std::vector<float> dout = random_floats(size_t(N) * OC, 13, -1e-3f, 1e-3f);
  const std::vector<float> bias = random_floats(OC, 14);
  x[5] *= 40, w[7] *= 40, dout[9] *= 40;  // one large element each: rowwise scales then differ from tensorwise
  // v [rows, cols] rounded to f with its own power-of-two scales, as floats (the values the
  // product multiplies): one scale for all (tensorwise), or one per row or per column (rowwise,
  // as the operand goes in as is or transposed).
  const auto dequantised = [](std::vector<float> v, int rows, int cols, Fp8Format f, Fp8Amax over) {
    const auto group = [&](size_t i) { return over == Fp8Amax::tensor ? 0 : over == Fp8Amax::rows ? i / cols : i % cols; };
    std::vector<float> amax(size_t(std::max(rows, cols)), 0.0f);
    for (size_t i = 0; i < v.size(); i++) amax[group(i)] = std::max(amax[group(i)], std::fabs(v[i]));
    for (size_t i = 0; i < v.size(); i++) {
      const int k = fp8_scale_exponent(amax[group(i)], f);
      v[i] = std::ldexp(fp8_decode(fp8_encode(std::ldexp(v[i], k), f), f), -k);
    }
    return v;
  };
  for (bool rowwise : {false, true})
    for (Fp8Format grad : kFormats) {
      INFO((rowwise ? "rowwise" : "tensorwise") << ", gradients in " << fp8_format_name(grad));
      const auto by = [&](Fp8Amax rowwise_over) { return rowwise ? rowwise_over : Fp8Amax::tensor; };
      const Fp8Format e4 = Fp8Format::e4m3;
      // Each product's operands, K-major: forward x and w by rows; dinp: dout by rows and w by
      // columns (w^T's rows); dw: dout and x by columns.
      const std::vector<float> xf = dequantised(x, N, IC, e4, by(Fp8Amax::rows)),
                               wf = dequantised(w, OC, IC, e4, by(Fp8Amax::rows)),
                               di = dequantised(dout, N, OC, grad, by(Fp8Amax::rows)),
                               wi = dequantised(w, OC, IC, e4, by(Fp8Amax::cols)),
                               dw_d = dequantised(dout, N, OC, grad, by(Fp8Amax::cols)),
                               dw_x = dequantised(x, N, IC, e4, by(Fp8Amax::cols));
      Fp8Linear layer(ops, tp, nullptr, grad, rowwise);
      const Tensor out = buf.zeros(size_t(N) * OC), dinp = buf.zeros(size_t(N) * IC),
                   dw = buf.f32(std::vector<float>(size_t(OC) * IC, 0.5f)), dbias = buf.zeros(OC);
      layer.forward(out, buf.f32(x), false, buf.f32(w), buf.f32(bias), N, IC, OC, Fp8Site{0});
      layer.backward(dinp, dw, dbias, buf.f32(dout), false, buf.f32(x), false, buf.f32(w), N, IC, OC, Fp8Site{0});
      // The same products in double over the dequantised values (each term exact; the sums here
      // are double, the layer's fp32, hence the tolerance).
      std::vector<float> want_out(size_t(N) * OC), want_dinp(size_t(N) * IC), want_dw(size_t(OC) * IC);
      for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
          double s = 0;
          for (int i = 0; i < IC; i++) s += double(xf[size_t(n) * IC + i]) * wf[size_t(o) * IC + i];
          want_out[size_t(n) * OC + o] = float(s + bias[o]);
        }
      for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
          double s = 0;
          for (int o = 0; o < OC; o++) s += double(di[size_t(n) * OC + o]) * wi[size_t(o) * IC + i];
          want_dinp[size_t(n) * IC + i] = float(s);
        }
      for (int o = 0; o < OC; o++)
        for (int i = 0; i < IC; i++) {
          double s = 0;
          for (int n = 0; n < N; n++) s += double(dw_d[size_t(n) * OC + o]) * dw_x[size_t(n) * IC + i];
          want_dw[size_t(o) * IC + i] = float(0.5 + s);
        }
      CHECK(relative_l2(buf.read(out), want_out) < 1e-6);
      CHECK(relative_l2(buf.read(dinp), want_dinp) < 1e-6);
      CHECK(relative_l2(buf.read(dw), want_dw) < 1e-6);
      // FP8 really rounded: the product differs from the fp32 one by the formats' precision.
      const Tensor exact_t = buf.zeros(size_t(N) * OC);
      ops.matmul_forward(exact_t, buf.f32(x), buf.f32(w), buf.f32(bias), N, IC, OC);
      const double err = relative_l2(buf.read(out), buf.read(exact_t));
      CHECK(err > 1e-4);
      CHECK(err < 0.1);
    }
}

TEST_CASE("precision.fp8 keys: recipes, layers and formats, with errors that name the key", "[fp8][config]") {
  const Fp8Recipe all = fp8_recipe("tensorwise", "all", "e5m2");
  using L = Fp8Layer;
  CHECK((all.on(L::qkv) && all.on(L::attn_out) && all.on(L::mlp_up) && all.on(L::mlp_down)));
  CHECK_FALSE(all.on(L::lm_head));  // the LM head only when asked
  CHECK(all.blocks());
  CHECK(all.grad == Fp8Format::e5m2);
  CHECK_FALSE(fp8_recipe("off", "all", "e5m2").any());
  const Fp8Recipe some = fp8_recipe("tensorwise", "mlp_down,qkv", "e4m3");
  CHECK((some.on(L::qkv) && !some.on(L::attn_out) && !some.on(L::mlp_up) && some.on(L::mlp_down)));
  CHECK(some.grad == Fp8Format::e4m3);
  const Fp8Recipe with_head = fp8_recipe("tensorwise", "all,lm_head", "e5m2");
  CHECK((with_head.blocks() && with_head.on(L::mlp_down) && with_head.on(L::lm_head)));
  const Fp8Recipe head_only = fp8_recipe("delayed", "lm_head", "e5m2");
  CHECK((head_only.any() && !head_only.blocks() && head_only.on(L::lm_head)));
  CHECK(fp8_layer_list(with_head, ",") == "qkv,attn_out,mlp_up,mlp_down,lm_head");
  const Fp8Recipe experts = fp8_recipe("delayed", "experts", "e5m2");
  CHECK((experts.any() && !experts.blocks() && experts.on(L::experts) && !experts.on(L::lm_head)));
  // A chunk's sites: its blocks' four each, the head's, then two per expert of each sparse block.
  const Fp8Sites sites{3, true, 2, 8};
  CHECK(sites.count() == 3 * kFp8BlockLayers + 1 + 2 * 8 * 2);
  CHECK(sites.block(2, L::mlp_down) == 2 * kFp8BlockLayers + 3);
  CHECK(sites.lm_head() == 3 * kFp8BlockLayers);
  CHECK(sites.expert(0, 0, false) == 3 * kFp8BlockLayers + 1);
  CHECK(sites.expert(1, 7, true) == sites.count() - 1);
  CHECK(Fp8Sites{3, false, 0, 0}.count() == 3 * kFp8BlockLayers);
  CHECK_THROWS_AS(parse_fp8_layers("qkv,head"), ConfigError);
  CHECK_THROWS_AS(parse_fp8_layers("qkv,qkv"), ConfigError);
  CHECK_THROWS_AS(parse_fp8_layers("all,qkv"), ConfigError);  // all names qkv already
  CHECK_THROWS_AS(parse_fp8_layers("lm_head,"), ConfigError);
  CHECK_THROWS_AS(parse_fp8_layers(""), ConfigError);

  const nlohmann::json base = {{"data", {{"train", "x_*.bin"}}}};
  const auto with = [&](const nlohmann::json& precision) {
    nlohmann::json j = base;
    j["precision"] = precision;
    return config_from_json(j, {}, 1);
  };
  CHECK(with({{"fp8", "tensorwise"}}).precision.fp8 == "tensorwise");
  CHECK(with({{"fp8", "rowwise"}}).precision.fp8 == "rowwise");
  CHECK(fp8_recipe("rowwise", "all", "e5m2").rowwise);
  CHECK_FALSE(fp8_recipe("tensorwise", "all", "e5m2").rowwise);
  const RunConfig delayed = with({{"fp8", "delayed"}, {"fp8_amax_history", 4}});
  CHECK(fp8_recipe(delayed.precision).delayed);
  CHECK(fp8_recipe(delayed.precision).amax_history == 4);
  CHECK_FALSE(fp8_recipe(delayed.precision).rowwise);
  CHECK(with({{"fp8", "delayed"}}).precision.fp8_amax_history == 16);
  CHECK_THROWS_WITH(with({{"fp8", "delayed"}, {"fp8_amax_history", 0}}), Catch::Contains("precision.fp8_amax_history"));
  CHECK_THROWS_WITH(with({{"fp8", "delayed"}, {"fp8_amax_history", 1025}}), Catch::Contains("precision.fp8_amax_history"));
  CHECK_THROWS_WITH(with({{"fp8", "yes"}}), Catch::Contains("precision.fp8"));
  CHECK(with({{"fp8", "tensorwise"}, {"fp8_layers", "qkv,lm_head"}}).precision.fp8_layers == "qkv,lm_head");
  CHECK_THROWS_WITH(with({{"fp8_layers", "qkv,attn"}}), Catch::Contains("precision.fp8_layers") && Catch::Contains("attn"));
  // Attention only when asked ("all" is the linear layers), under any recipe; under context
  // parallelism only as Ulysses (ring attention's partial softmaxes would quantise P unlike one rank).
  CHECK_FALSE(all.on(L::attention));
  const Fp8Recipe attention = fp8_recipe("delayed", "all,attention", "e5m2");
  CHECK((attention.on(L::attention) && attention.blocks() && !attention.on(L::lm_head)));
  CHECK(fp8_layer_list(attention, ",") == "qkv,attn_out,mlp_up,mlp_down,attention");
  CHECK(Fp8Sites{}.count() == 0);
  const auto cp2 = [&](const char* impl, const char* layers) {
    nlohmann::json j = base;
    j["parallel"] = {{"cp", 2}, {"cp_impl", impl}};
    j["precision"] = {{"fp8", "tensorwise"}, {"fp8_layers", layers}};
    return config_from_json(j, {}, 2);
  };
  CHECK(cp2("ulysses", "all,attention").parallel.cp_impl == "ulysses");
  CHECK(cp2("ring", "all").parallel.cp_impl == "ring");
  CHECK_THROWS_WITH(cp2("ring", "attention"), Catch::Contains("precision.fp8_layers=attention") &&
                                                  Catch::Contains("parallel.cp_impl") && Catch::Contains("ulysses"));
  // The routed experts: delayed scaling only, and a model with experts.
  const auto moe = [&](const nlohmann::json& precision) {
    nlohmann::json j = base;
    j["model"] = {{"arch", "llama"}, {"n_layers", 2}, {"d_model", 64}, {"n_heads", 4}, {"n_kv_heads", 2}};
    j["moe"] = {{"n_experts", 4}, {"top_k", 2}, {"expert_hidden", 32}};
    j["precision"] = precision;
    return config_from_json(j, {}, 1);
  };
  CHECK(moe({{"fp8", "delayed"}, {"fp8_layers", "all,experts"}}).precision.fp8_layers == "all,experts");
  CHECK_THROWS_WITH(moe({{"fp8", "tensorwise"}, {"fp8_layers", "all,experts"}}),
                    Catch::Contains("precision.fp8_layers") && Catch::Contains("delayed"));
  CHECK_THROWS_WITH(with({{"fp8", "delayed"}, {"fp8_layers", "experts"}}),
                    Catch::Contains("precision.fp8_layers") && Catch::Contains("no routed experts"));
  CHECK(with({{"fp8", "off"}, {"fp8_layers", "experts"}}).precision.fp8 == "off");  // unused when off
  CHECK_THROWS_WITH(with({{"fp8_grad_format", "e3m4"}}), Catch::Contains("precision.fp8_grad_format"));
}
