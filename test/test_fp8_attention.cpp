// FP8 attention on the CPU (Ops::attention_fp8_forward/backward; core/common/fp8_attention.h
// defines the algorithm CudaOps' kernel runs and CpuOps emulates):
//  - the emulation equals the algorithm written another way: each key's probability code taken
//    under the running max of its 64-key tile, the output summed with the product of later
//    rescalings in closed form (2^(m_tile - m_final)), in double;
//  - it is attention: close to the fp32 op (within FP8's rounding), yet not equal to it;
//  - its scales are per (sequence, head): a v head scaled by 2^10 scales that head's output by
//    2^10 exactly and leaves every other head's bits alone; a batch equals its sequences run
//    alone and a head group its heads run alone, bit for bit (why dp, tp and Ulysses equal one
//    rank);
//  - the backward is attention_backward on the dequantised q, k, v (built here from
//    fp8_encode/fp8_decode), bit for bit, and close to fp32 attention's gradient;
//  - the V code position map the GPU kernel uses is a permutation within each 16 keys.
// Shapes: ragged T (150: two whole tiles and a partial one), head size 32, GQA 4:2.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <vector>

#include "core/common/fp8_attention.h"
#include "core/cpu/cpu_ops.h"
#include "cpu_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

struct Shape {
  int B = 2, T = 150, NH = 4, NKV = 2, HS = 32;
  int W() const { return (NH + 2 * NKV) * HS; }
  int C() const { return NH * HS; }
  size_t qkv() const { return size_t(B) * T * W(); }
  size_t out() const { return size_t(B) * T * C(); }
  size_t lse() const { return size_t(B) * NH * T; }
};

// Random q, k, v whose heads differ in magnitude (so one scale for all would not do): q and k
// heads by up to 2^2 (scores of a few units: a softmax neither flat nor one-hot), v heads by up
// to 2^6.
std::vector<float> random_qkv(const Shape& s, uint32_t seed) {
  std::vector<float> x = random_floats(s.qkv(), seed, -1.0f, 1.0f);
  for (size_t i = 0; i < x.size(); i++) {
    const int head = int(i % s.W()) / s.HS, b = int(i / (size_t(s.T) * s.W()));
    const bool v = head >= s.NH + s.NKV;
    x[i] *= std::ldexp(1.0f, v ? (head * 3 + b * 2) % 7 - 2 : (head + b) % 3 - 1);
  }
  return x;
}

struct Result {
  std::vector<float> out, lse;
};

Result forward(Ops& ops, const Shape& s, std::vector<float> qkv, bool fp8) {
  Result r{std::vector<float>(s.out(), NAN), std::vector<float>(s.lse(), NAN)};
  const Tensor o{r.out.data(), r.out.size(), DType::f32}, l{r.lse.data(), r.lse.size(), DType::f32},
      x{qkv.data(), qkv.size(), DType::f32};
  if (fp8)
    ops.attention_fp8_forward(o, l, x, s.B, s.T, s.C(), s.NH, s.NKV);
  else
    ops.attention_forward(o, l, x, s.B, s.T, s.C(), s.NH, s.NKV);
  return r;
}

// Each (b, head)'s codes as values and its scale_inv, from fp8.h's functions directly.
struct Codes {
  std::vector<float> value;      // the code's value, qkv's layout
  std::vector<float> scale_inv;  // [B, NH + 2 NKV]
};
Codes quantise(const Shape& s, const std::vector<float>& x) {
  const int heads = s.NH + 2 * s.NKV;
  Codes c{std::vector<float>(x.size()), std::vector<float>(size_t(s.B) * heads)};
  for (int b = 0; b < s.B; b++)
    for (int h = 0; h < heads; h++) {
      float amax = 0;
      for (int t = 0; t < s.T; t++)
        for (int i = 0; i < s.HS; i++) amax = std::max(amax, std::fabs(x[(size_t(b) * s.T + t) * s.W() + h * s.HS + i]));
      const int k = fp8_scale_exponent(amax, Fp8Format::e4m3);
      c.scale_inv[size_t(b) * heads + h] = std::ldexp(1.0f, -k);
      for (int t = 0; t < s.T; t++)
        for (int i = 0; i < s.HS; i++) {
          const size_t at = (size_t(b) * s.T + t) * s.W() + h * s.HS + i;
          c.value[at] = fp8_decode(fp8_encode(std::ldexp(x[at], k), Fp8Format::e4m3), Fp8Format::e4m3);
        }
    }
  return c;
}

// The algorithm in closed form, in double where it does not matter: key j's probability code is
// taken under m_J, the running max after its tile J; the output is sum_j pv_j v_j 2^(m_J - m_final)
// over sum_j p_j 2^(m_J - m_final), which the tile-by-tile rescaling computes as a recurrence.
Result closed_form(const Shape& s, const std::vector<float>& x) {
  const Codes c = quantise(s, x);
  const int heads = s.NH + 2 * s.NKV, tile = kFp8AttnKeyTile;
  Result r{std::vector<float>(s.out()), std::vector<float>(s.lse())};
  for (int b = 0; b < s.B; b++)
    for (int h = 0; h < s.NH; h++) {
      const int g = h / (s.NH / s.NKV);
      const float* inv = &c.scale_inv[size_t(b) * heads];
      const float cs = (inv[h] * inv[s.NH + g]) * fp8_attn_scale_log2(s.HS);
      for (int t = 0; t < s.T; t++) {
        std::vector<float> xs(t + 1), m_tile(t + 1);
        float m = -INFINITY;
        for (int j = 0; j <= t; j++) {
          float d = 0;
          for (int i = 0; i < s.HS; i++)
            d += c.value[(size_t(b) * s.T + t) * s.W() + h * s.HS + i] *
                 c.value[(size_t(b) * s.T + j) * s.W() + (s.NH + g) * s.HS + i];
          xs[j] = cs * d;
        }
        for (int j = 0; j <= t; j++) {
          if (j % tile == 0)
            for (int k = j; k <= std::min(t, j + tile - 1); k++) m = std::max(m, xs[k]);
          m_tile[j] = m;
        }
        double l = 0;
        std::vector<double> acc(s.HS, 0.0);
        for (int j = 0; j <= t; j++) {
          const float p = std::exp2(xs[j] - m_tile[j]);
          const double later = std::exp2(double(m_tile[j]) - m);  // the rescalings of the tiles after J
          const double pv = fp8_decode(fp8_encode(p * 256.0f, Fp8Format::e4m3), Fp8Format::e4m3);
          l += p * later;
          for (int i = 0; i < s.HS; i++)
            acc[i] += pv * later * c.value[(size_t(b) * s.T + j) * s.W() + (s.NH + s.NKV + g) * s.HS + i];
        }
        for (int i = 0; i < s.HS; i++)
          r.out[(size_t(b) * s.T + t) * s.C() + h * s.HS + i] = float(acc[i] * inv[s.NH + s.NKV + g] / 256.0 / l);
        r.lse[(size_t(b) * s.NH + h) * s.T + t] = float((m + std::log2(l)) * std::log(2.0));
      }
    }
  return r;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// The largest |a - b| over the largest |b|, and the mean |a - b| over the mean |b|.
std::pair<double, double> errors(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, sum = 0, ref = 0;
  for (size_t i = 0; i < a.size(); i++) {
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    sum += std::fabs(a[i] - b[i]);
    ref += std::fabs(b[i]);
  }
  return {worst / max_abs(b), sum / ref};
}

}  // namespace

TEST_CASE("FP8 attention is the algorithm of fp8_attention.h: codes under each tile's running max", "[fp8][attention]") {
  CpuOps ops;
  const Shape s;
  const std::vector<float> x = random_qkv(s, 11);
  const Result got = forward(ops, s, x, true), want = closed_form(s, x);
  for (size_t i = 0; i < got.out.size(); i++) REQUIRE(std::isfinite(got.out[i]));
  const auto [worst, mean] = errors(got.out, want.out);
  INFO("closed form: worst " << worst << ", mean " << mean);
  CHECK(worst < 1e-5);
  for (size_t i = 0; i < got.lse.size(); i++) CHECK(got.lse[i] == Approx(want.lse[i]).margin(1e-5));
}

TEST_CASE("FP8 attention is attention within FP8's rounding, and really rounds", "[fp8][attention]") {
  CpuOps ops;
  const Shape s;
  const std::vector<float> x = random_qkv(s, 12);
  const Result fp8 = forward(ops, s, x, true), fp32 = forward(ops, s, x, false);
  const auto [worst, mean] = errors(fp8.out, fp32.out);
  INFO("against fp32 attention: worst " << worst << ", mean " << mean);
  // e4m3 keeps 3 mantissa bits: a value is off by up to 2^-4 of itself (v alone: a row that sees
  // one key gets its v's codes, 2-3% off); the average over the keys keeps that relative size.
  CHECK(worst < 0.15);
  CHECK(mean < 0.08);
  CHECK(mean > 1e-3);  // not the fp32 op
  double lse_gap = 0;
  for (size_t i = 0; i < fp8.lse.size(); i++) lse_gap = std::max(lse_gap, double(std::fabs(fp8.lse[i] - fp32.lse[i])));
  CHECK(lse_gap < 0.1);
}

TEST_CASE("FP8 attention scales each (sequence, head) alone: heads, batches and groups split exactly", "[fp8][attention]") {
  CpuOps ops;
  const Shape s;
  const std::vector<float> x = random_qkv(s, 13);
  const Result base = forward(ops, s, x, true);

  // v head 1 (query heads 2 and 3 read it) of sequence 0 times 2^10: their outputs times 2^10
  // exactly, every other output bit for bit.
  std::vector<float> scaled = x;
  for (int t = 0; t < s.T; t++)
    for (int i = 0; i < s.HS; i++) scaled[size_t(t) * s.W() + (s.NH + s.NKV + 1) * s.HS + i] *= 1024.0f;
  const Result r = forward(ops, s, scaled, true);
  size_t moved = 0;
  for (int b = 0; b < s.B; b++)
    for (int t = 0; t < s.T; t++)
      for (int h = 0; h < s.NH; h++)
        for (int i = 0; i < s.HS; i++) {
          const size_t at = (size_t(b) * s.T + t) * s.C() + h * s.HS + i;
          const bool in_head = b == 0 && h >= 2;
          moved += in_head && base.out[at] != 0;
          REQUIRE(r.out[at] == (in_head ? base.out[at] * 1024.0f : base.out[at]));
        }
  CHECK(moved > 0);
  CHECK(r.lse == base.lse);

  // Each sequence alone (data parallel, micro-batches): the same bits.
  Shape one = s;
  one.B = 1;
  for (int b = 0; b < s.B; b++) {
    const std::vector<float> xb(x.begin() + size_t(b) * s.T * s.W(), x.begin() + size_t(b + 1) * s.T * s.W());
    const Result rb = forward(ops, one, xb, true);
    CHECK(std::equal(rb.out.begin(), rb.out.end(), base.out.begin() + size_t(b) * s.T * s.C()));
    CHECK(std::equal(rb.lse.begin(), rb.lse.end(), base.lse.begin() + size_t(b) * s.NH * s.T));
  }

  // Each key/value head with its query heads alone (tensor parallel, Ulysses): the same bits.
  Shape half = s;
  half.NH = s.NH / 2, half.NKV = s.NKV / 2;
  for (int part = 0; part < 2; part++) {
    std::vector<float> xp(half.qkv());
    for (size_t row = 0; row < size_t(s.B) * s.T; row++) {
      const float* src = &x[row * s.W()];
      float* dst = &xp[row * half.W()];
      const int q0 = part * half.NH * s.HS, k0 = (s.NH + part * half.NKV) * s.HS,
                v0 = (s.NH + s.NKV + part * half.NKV) * s.HS;
      std::copy(src + q0, src + q0 + half.NH * s.HS, dst);
      std::copy(src + k0, src + k0 + half.NKV * s.HS, dst + half.NH * s.HS);
      std::copy(src + v0, src + v0 + half.NKV * s.HS, dst + (half.NH + half.NKV) * s.HS);
    }
    const Result rp = forward(ops, half, xp, true);
    for (size_t row = 0; row < size_t(s.B) * s.T; row++)
      CHECK(std::equal(rp.out.begin() + row * half.C(), rp.out.begin() + (row + 1) * half.C(),
                       base.out.begin() + row * s.C() + part * half.C()));
  }
}

TEST_CASE("FP8 attention's backward is attention's on the dequantised q, k, v", "[fp8][attention]") {
  CpuOps ops;
  const Shape s;
  const std::vector<float> x = random_qkv(s, 14);
  Result fwd = forward(ops, s, x, true);
  std::vector<float> dout = random_floats(s.out(), 15);
  std::vector<float> xin = x, dx(s.qkv(), NAN);
  const auto T = [](std::vector<float>& v) { return Tensor{v.data(), v.size(), DType::f32}; };
  ops.attention_fp8_backward(T(dx), T(dout), T(xin), T(fwd.out), T(fwd.lse), s.B, s.T, s.C(), s.NH, s.NKV);
  CHECK(xin == x);  // qkv is read, not changed

  const Codes c = quantise(s, x);
  const int heads = s.NH + 2 * s.NKV;
  std::vector<float> dequantised(s.qkv()), want(s.qkv(), NAN);
  for (size_t i = 0; i < dequantised.size(); i++) {
    const size_t row = i / s.W();
    dequantised[i] = c.value[i] * c.scale_inv[(row / s.T) * heads + (i % s.W()) / s.HS];
  }
  ops.attention_backward(T(want), T(dout), T(dequantised), T(fwd.out), T(fwd.lse), s.B, s.T, s.C(), s.NH, s.NKV);
  CHECK(bitwise_equal(dx, want));

  // Close to the fp32 gradient (the straight-through estimate of FP8's rounding).
  Result full = forward(ops, s, x, false);
  std::vector<float> exact(s.qkv(), NAN), xf = x;
  ops.attention_backward(T(exact), T(dout), T(xf), T(full.out), T(full.lse), s.B, s.T, s.C(), s.NH, s.NKV);
  const auto [worst, mean] = errors(dx, exact);
  INFO("against the fp32 gradient: worst " << worst << ", mean " << mean);
  CHECK(mean < 0.1);
  CHECK(mean > 1e-3);
}

TEST_CASE("the GPU kernel's V code positions permute each 16 keys", "[fp8][attention]") {
  std::set<int> seen;
  for (int k = 0; k < 64; k++) {
    const int p = fp8_attn_v_position(k);
    CHECK(p / 16 == k / 16);
    seen.insert(p);
  }
  CHECK(seen.size() == 64);
  // Position 4i + e holds key 2i + (e & 1) + 8 (e >> 1): the keys one thread's P fragment holds.
  for (int i = 0; i < 4; i++)
    for (int e = 0; e < 4; e++) CHECK(fp8_attn_v_position(2 * i + (e & 1) + 8 * (e >> 1)) == 4 * i + e);
  CHECK(fp8_attn_padded_keys(1) == kFp8AttnKeyTile);
  CHECK(fp8_attn_padded_keys(kFp8AttnKeyTile) == kFp8AttnKeyTile);
  CHECK(fp8_attn_padded_keys(150) == 3 * kFp8AttnKeyTile);
}
