// CpuOps RMSNorm, RoPE and SwiGLU (the Llama ops): forward against double-precision references
// written here from Hugging Face's definitions (not from the implementation's loops), backward
// against central finite differences of those references (loss L = sum(out * R) for a fixed
// random R, so dout = R), the += / overwrite contract of every gradient, the fused residual +
// RMSNorm bitwise against its two ops, RoPE's rotate-half layout, positions that are not
// 0..T-1, and rope_backward undoing rope_forward. Shapes are deliberately small and awkward.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "core/ops/rope_frequencies.h"
#include "cpu_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

struct RmsNormRef {
  std::vector<double> out, rstd;
};

// LlamaRMSNorm: weight * (x * rsqrt(mean(x^2) + eps)).
RmsNormRef rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w, int N, int C, double eps) {
  RmsNormRef r{std::vector<double>(x.size()), std::vector<double>(N)};
  for (int n = 0; n < N; n++) {
    double ms = 0;
    for (int c = 0; c < C; c++) ms += x[size_t(n) * C + c] * x[size_t(n) * C + c];
    ms /= C;
    r.rstd[n] = 1.0 / std::sqrt(ms + eps);
    for (int c = 0; c < C; c++) r.out[size_t(n) * C + c] = w[c] * (x[size_t(n) * C + c] * r.rstd[n]);
  }
  return r;
}

// Hugging Face's apply_rotary_pos_emb, literally: emb = cat(freqs, freqs), cos/sin of it, and
// q * cos + rotate_half(q) * sin with rotate_half(x) = cat(-x2, x1). The angles are the float
// products PyTorch forms (float inv_freq times float position); the rest is in double.
std::vector<double> rope_ref(const std::vector<double>& qkv, const std::vector<int32_t>& pos, int B, int T,
                             int row_width, int rot_heads, int HS, float theta) {
  std::vector<double> out = qkv;  // v (and anything past the rotated heads) passes through
  const int half = HS / 2;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      std::vector<double> cos_e(HS), sin_e(HS);
      for (int j = 0; j < HS; j++) {
        float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * (j % half)) / static_cast<float>(HS));
        float angle = static_cast<float>(pos[t]) * inv_freq;
        cos_e[j] = std::cos(double(angle));
        sin_e[j] = std::sin(double(angle));
      }
      for (int h = 0; h < rot_heads; h++) {
        const size_t base = (size_t(b) * T + t) * row_width + size_t(h) * HS;
        std::vector<double> rotated(HS);  // rotate_half
        for (int j = 0; j < half; j++) rotated[j] = -qkv[base + half + j];
        for (int j = half; j < HS; j++) rotated[j] = qkv[base + j - half];
        for (int j = 0; j < HS; j++) out[base + j] = qkv[base + j] * cos_e[j] + rotated[j] * sin_e[j];
      }
    }
  return out;
}

// out[n, j] = silu(gate) * up over rows gate | up of width 2H.
std::vector<double> swiglu_ref(const std::vector<double>& gu, int N, int H) {
  std::vector<double> out(size_t(N) * H);
  for (int n = 0; n < N; n++)
    for (int j = 0; j < H; j++) {
      double g = gu[size_t(n) * 2 * H + j], u = gu[size_t(n) * 2 * H + H + j];
      out[size_t(n) * H + j] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

// a[i] + b[i] rounded to float: what a "+=" into a pre-filled buffer must produce, bit for bit.
std::vector<float> float_sum(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> s(a.size());
  for (size_t i = 0; i < a.size(); i++) s[i] = a[i] + b[i];
  return s;
}

}  // namespace

TEST_CASE("rmsnorm: forward matches LlamaRMSNorm in double, backward matches finite differences", "[cpu][llama][rmsnorm]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 7, C = 13;
  const float eps = 1e-6f;  // Llama's rms_norm_eps
  std::vector<float> x = random_floats(size_t(N) * C, 101);
  for (int n = 0; n < N; n++)  // rows of very different scale, and one with a large mean
    for (int c = 0; c < C; c++) x[size_t(n) * C + c] = x[size_t(n) * C + c] * (0.25f + n) + (n == 3 ? 5.0f : 0.0f);
  std::vector<float> w = random_floats(C, 102, 0.5f, 1.5f), R = random_floats(x.size(), 103);
  Tensor t_x = bufs.f32(x), t_w = bufs.f32(w), t_R = bufs.f32(R);
  Tensor out = bufs.f32(random_floats(x.size(), 104)), rstd = bufs.zeros(N);  // forward overwrites

  // Tolerance 1e-5 (abs and rel): float sums over 13 channels.
  ops.rmsnorm_forward(out, rstd, t_x, t_w, N, C, eps);
  std::vector<double> xd = to_double(x), wd = to_double(w);
  RmsNormRef ref = rmsnorm_ref(xd, wd, N, C, eps);
  require_close(bufs.read(out), ref.out, 1e-5, 1e-5, "out");
  require_close(bufs.read(rstd), ref.rstd, 1e-5, 1e-5, "rstd");
  const std::vector<float> out1 = bufs.read(out);
  Tensor out_eval = bufs.zeros(x.size());
  ops.rmsnorm_forward(out_eval, Tensor{}, t_x, t_w, N, C, eps);  // rstd null (evaluation)
  CHECK(bitwise_equal(bufs.read(out_eval), out1));

  // Tolerance atol 1e-5, rtol 1e-4: the float backward against exact double derivatives.
  Tensor dx = bufs.zeros(x.size()), dw = bufs.zeros(C);
  auto backward = [&] { ops.rmsnorm_backward(dx, dw, t_R, t_x, t_w, rstd, N, C); };
  backward();
  const std::vector<float> dx1 = bufs.read(dx), dw1 = bufs.read(dw);
  require_close(dx1, numeric_grad([&](const std::vector<double>& v) { return dot(rmsnorm_ref(v, wd, N, C, eps).out, R); }, xd),
                1e-5, 1e-4, "dinp");
  require_close(dw1, numeric_grad([&](const std::vector<double>& v) { return dot(rmsnorm_ref(xd, v, N, C, eps).out, R); }, wd),
                1e-5, 1e-4, "dw");

  SECTION("gradients accumulate into pre-filled buffers") {
    const std::vector<float> dx0 = random_floats(x.size(), 105), dw0 = random_floats(C, 106);
    Tensor dxp = bufs.f32(dx0), dwp = bufs.f32(dw0);
    ops.rmsnorm_backward(dxp, dwp, t_R, t_x, t_w, rstd, N, C);
    CHECK(bitwise_equal(bufs.read(dxp), float_sum(dx0, dx1)));
    CHECK(bitwise_equal(bufs.read(dwp), float_sum(dw0, dw1)));
    check_accumulates(ops, bufs, {dx, dw}, backward);
  }
  SECTION("null gradients are skipped and do not change the others") {
    Tensor dx_only = bufs.zeros(x.size()), dw_only = bufs.zeros(C);
    ops.rmsnorm_backward(dx_only, Tensor{}, t_R, t_x, t_w, rstd, N, C);
    ops.rmsnorm_backward(Tensor{}, dw_only, t_R, t_x, Tensor{}, rstd, N, C);  // w unused for dw
    CHECK(bitwise_equal(bufs.read(dx_only), dx1));
    CHECK(bitwise_equal(bufs.read(dw_only), dw1));
    ops.rmsnorm_backward(Tensor{}, Tensor{}, t_R, t_x, t_w, Tensor{}, N, C);  // nothing asked: no checks, no work
  }
  SECTION("results do not depend on the thread count") {
    check_thread_count_independent([&] {
      Tensor o = bufs.zeros(x.size()), r = bufs.zeros(N), gx = bufs.zeros(x.size()), gw = bufs.zeros(C);
      ops.rmsnorm_forward(o, r, t_x, t_w, N, C, eps);
      ops.rmsnorm_backward(gx, gw, t_R, t_x, t_w, r, N, C);
      return std::vector<std::vector<float>>{bufs.read(o), bufs.read(r), bufs.read(gx), bufs.read(gw)};
    });
  }
  SECTION("a wrong dtype or a short buffer is an error naming the argument") {
    CHECK_THROWS_WITH(ops.rmsnorm_forward(out, rstd, t_x, bufs.zeros(C - 1), N, C, eps), Catch::Contains("w holds"));
    CHECK_THROWS_AS(ops.rmsnorm_backward(dx, dw, t_R, t_x, t_w, Tensor{}, N, C), RuntimeError);  // rstd needed
  }
}

TEST_CASE("residual_rmsnorm_forward: bitwise add + rmsnorm_forward, residual may alias a or b", "[cpu][llama][rmsnorm]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 5, C = 11;
  const size_t NC = size_t(N) * C;
  const float eps = 1e-5f;
  std::vector<float> a = random_floats(NC, 111), b = random_floats(NC, 112);
  for (float& v : a) v += 4.0f;  // a residual stream far from 0
  std::vector<float> w = random_floats(C, 113, 0.5f, 1.5f);
  Tensor t_a = bufs.f32(a), t_b = bufs.f32(b), t_w = bufs.f32(w);
  const std::vector<float> poison(NC, std::nanf(""));

  Tensor ref_res = bufs.zeros(NC), ref_out = bufs.zeros(NC), ref_rstd = bufs.zeros(N);
  ops.add(ref_res, t_a, t_b, NC);
  ops.rmsnorm_forward(ref_out, ref_rstd, ref_res, t_w, N, C, eps);
  std::vector<double> res_d(NC);
  for (size_t i = 0; i < NC; i++) res_d[i] = double(a[i]) + double(b[i]);
  require_close(bufs.read(ref_out), rmsnorm_ref(res_d, to_double(w), N, C, eps).out, 1e-5, 1e-5, "reference out");

  auto check_same = [&](Tensor res, Tensor out, Tensor rstd) {
    CHECK(bitwise_equal(bufs.read(res), bufs.read(ref_res)));
    CHECK(bitwise_equal(bufs.read(out), bufs.read(ref_out)));
    if (rstd) CHECK(bitwise_equal(bufs.read(rstd), bufs.read(ref_rstd)));
  };
  SECTION("separate residual") {
    Tensor res = bufs.f32(poison), out = bufs.f32(poison), rstd = bufs.f32(std::vector<float>(N, std::nanf("")));
    ops.residual_rmsnorm_forward(res, out, rstd, t_a, t_b, t_w, N, C, eps);
    check_same(res, out, rstd);
    CHECK(bitwise_equal(bufs.read(t_a), a));  // inputs untouched
    CHECK(bitwise_equal(bufs.read(t_b), b));
  }
  SECTION("residual aliases a (in place on the stream)") {
    Tensor stream = bufs.f32(a), out = bufs.f32(poison), rstd = bufs.zeros(N);
    ops.residual_rmsnorm_forward(stream, out, rstd, stream, t_b, t_w, N, C, eps);
    check_same(stream, out, rstd);
  }
  SECTION("residual aliases b") {
    Tensor stream = bufs.f32(b), out = bufs.f32(poison), rstd = bufs.zeros(N);
    ops.residual_rmsnorm_forward(stream, out, rstd, t_a, stream, t_w, N, C, eps);
    check_same(stream, out, rstd);
  }
  SECTION("null rstd (evaluation)") {
    Tensor res = bufs.f32(poison), out = bufs.f32(poison);
    ops.residual_rmsnorm_forward(res, out, Tensor{}, t_a, t_b, t_w, N, C, eps);
    check_same(res, out, Tensor{});
  }
}

TEST_CASE("rope: the rotate-half layout pairs dimension i with i + HS/2", "[cpu][llama][rope]") {
  CpuOps ops;
  Buffers bufs(ops);
  // One row of 2 heads of HS = 8. Dimension 0 has inv_freq = 1, so its angle is the position.
  const int HS = 8, row_width = 2 * HS, pos = 3;
  std::vector<float> x(row_width, 0.0f);
  x[0] = 1.0f;       // head 0, first half
  x[HS + 1] = 1.0f;  // head 1, dimension 1 (pairs with 1 + HS/2 = 5)
  Tensor t_x = bufs.f32(x), t_pos = bufs.i32({pos});
  ops.rope_forward(t_x, t_pos, 1, 1, row_width, 2, HS, 10000.0f);
  std::vector<float> got = bufs.read(t_x);
  const float inv1 = rope_inv_freq(1, HS, 10000.0f);  // 10000^(-1/4) = 0.1
  CHECK(inv1 == Approx(0.1f).epsilon(1e-6));
  std::vector<float> want(row_width, 0.0f);
  want[0] = std::cos(3.0f);                // x[0] c
  want[HS / 2] = std::sin(3.0f);           // x[0] s lands on its partner HS/2, not on dimension 1
  want[HS + 1] = std::cos(3.0f * inv1);
  want[HS + 1 + HS / 2] = std::sin(3.0f * inv1);
  require_close(got, want, 1e-7, 0.0, "rotated unit vectors");
}

TEST_CASE("rope: forward matches apply_rotary_pos_emb, backward matches finite differences and undoes forward", "[cpu][llama][rope]") {
  CpuOps ops;
  Buffers bufs(ops);
  // Grouped-query rows: 3 q heads, 1 k head, 1 v head of HS = 6; rotate q and k (4 heads).
  const int B = 2, T = 5, HS = 6, n_heads = 3, n_kv = 1;
  const int row_width = (n_heads + 2 * n_kv) * HS, rot_heads = n_heads + n_kv;
  const float theta = 500000.0f;  // Llama 3's
  // Global positions of a context-parallel chunk: not 0..T-1, not sorted, one far out.
  const std::vector<int32_t> pos = {7, 3, 4095, 0, 12};
  const size_t n = size_t(B) * T * row_width;
  const std::vector<float> x = random_floats(n, 121), R = random_floats(n, 122);
  Tensor t_x = bufs.f32(x), t_pos = bufs.i32(pos);

  // Tolerance 1e-6: the same float angles; one float rotation against double.
  ops.rope_forward(t_x, t_pos, B, T, row_width, rot_heads, HS, theta);
  const std::vector<float> y = bufs.read(t_x);
  std::vector<double> xd = to_double(x);
  require_close(y, rope_ref(xd, pos, B, T, row_width, rot_heads, HS, theta), 1e-6, 1e-6, "out");
  for (int r = 0; r < B * T; r++)  // v is untouched, bit for bit
    for (int j = rot_heads * HS; j < row_width; j++) CHECK(y[size_t(r) * row_width + j] == x[size_t(r) * row_width + j]);

  // The backward of L = sum(rope(x) * R) is rope_backward(R), in place; rope is linear, so central
  // differences are exact up to rounding (tolerance 1e-6).
  Tensor t_d = bufs.f32(R);
  ops.rope_backward(t_d, t_pos, B, T, row_width, rot_heads, HS, theta);
  auto loss = [&](const std::vector<double>& v) { return dot(rope_ref(v, pos, B, T, row_width, rot_heads, HS, theta), R); };
  require_close(bufs.read(t_d), numeric_grad(loss, xd), 1e-6, 1e-6, "dqkv");

  // A rotation is orthogonal: backward (the transpose) of forward gives x back, to float rounding.
  ops.rope_backward(t_x, t_pos, B, T, row_width, rot_heads, HS, theta);
  require_close(bufs.read(t_x), x, 1e-6, 1e-6, "rope_backward(rope_forward(x))");

  SECTION("results do not depend on the thread count") {
    check_thread_count_independent([&] {
      Tensor v = bufs.f32(x);
      ops.rope_forward(v, t_pos, B, T, row_width, rot_heads, HS, theta);
      return std::vector<std::vector<float>>{bufs.read(v)};
    });
  }
  SECTION("shapes that cannot be rotated are errors") {
    CHECK_THROWS_WITH(ops.rope_forward(t_x, t_pos, B, T, row_width, rot_heads, 5, theta), Catch::Contains("even"));
    CHECK_THROWS_WITH(ops.rope_forward(t_x, t_pos, B, T, row_width, n_heads + 2 * n_kv + 1, HS, theta),
                      Catch::Contains("do not fit"));
    CHECK_THROWS_AS(ops.rope_forward(t_x, bufs.i32({1, 2}), B, T, row_width, rot_heads, HS, theta), RuntimeError);
  }
}

TEST_CASE("rope: inverse frequencies are theta^(-2i/HS) in PyTorch's float arithmetic", "[cpu][llama][rope]") {
  for (int HS : {64, 128}) {
    for (float theta : {10000.0f, 500000.0f}) {
      for (int i = 0; i < HS / 2; i++) {
        const double want = std::pow(double(theta), -2.0 * i / HS);
        INFO("HS " << HS << " theta " << theta << " i " << i);
        CHECK(std::fabs(rope_inv_freq(i, HS, theta) - want) <= 4e-7 * want);
      }
    }
  }
}

TEST_CASE("swiglu: forward is silu(gate) * up, backward matches finite differences and overwrites", "[cpu][llama][swiglu]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 5, H = 7;
  std::vector<float> gu = random_floats(size_t(N) * 2 * H, 131, -4.0f, 4.0f);
  const std::vector<float> R = random_floats(size_t(N) * H, 132);
  Tensor t_gu = bufs.f32(gu), t_R = bufs.f32(R);

  // Tolerance 1e-6: one exp and a few float operations per element.
  Tensor out = bufs.f32(random_floats(size_t(N) * H, 133));  // overwritten
  ops.swiglu_forward(out, t_gu, N, H);
  std::vector<double> gud = to_double(gu);
  require_close(bufs.read(out), swiglu_ref(gud, N, H), 1e-6, 1e-6, "out");

  // Tolerance atol 1e-5, rtol 1e-4, as the other backwards.
  Tensor d = bufs.zeros(gu.size());
  auto backward = [&] { ops.swiglu_backward(d, t_gu, t_R, N, H); };
  backward();
  require_close(bufs.read(d), numeric_grad([&](const std::vector<double>& v) { return dot(swiglu_ref(v, N, H), R); }, gud),
                1e-5, 1e-4, "dgate_up");
  check_overwrites(ops, bufs, {d}, backward);  // NaN-filled dgate_up gives the same bits as zeroed
  ops.swiglu_backward(Tensor{}, t_gu, t_R, N, H);  // null: skipped

  SECTION("saturated gates give the limits, never NaN") {
    // exp(-g) overflows for g < -88: silu -> -0 (times up), silu' -> 0; for large g silu -> g, silu' -> 1.
    const std::vector<float> ext = {-1000.0f, -100.0f, 100.0f, 1000.0f, 2.0f, 3.0f, 4.0f, 5.0f};
    Tensor t_ext = bufs.f32(ext), o = bufs.zeros(4), dd = bufs.zeros(8);
    ops.swiglu_forward(o, t_ext, 1, 4);
    ops.swiglu_backward(dd, t_ext, bufs.f32({1.0f, 1.0f, 1.0f, 1.0f}), 1, 4);
    const std::vector<float> got = bufs.read(o), dgot = bufs.read(dd);
    CHECK(got == std::vector<float>{0.0f, 0.0f, 400.0f, 5000.0f});
    CHECK(dgot == std::vector<float>{0.0f, 0.0f, 4.0f, 5.0f, 0.0f, 0.0f, 100.0f, 1000.0f});
  }
  SECTION("results do not depend on the thread count") {
    check_thread_count_independent([&] {
      Tensor o = bufs.zeros(size_t(N) * H), g = bufs.zeros(gu.size());
      ops.swiglu_forward(o, t_gu, N, H);
      ops.swiglu_backward(g, t_gu, t_R, N, H);
      return std::vector<std::vector<float>>{bufs.read(o), bufs.read(g)};
    });
  }
}
