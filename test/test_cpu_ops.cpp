// CpuOps memory, argument checks, GELU / add / scale, the fused softmax cross-entropy, AdamW
// and the host reductions. The layers are in test_cpu_layers.cpp and attention in
// test_cpu_attention.cpp. A hidden benchmark ("[.][bench]") reports the matmul GFLOP/s.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <numbers>
#include <string>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "cpu_test_support.h"

using namespace pt;
using namespace pt::test;

TEST_CASE("cpu memory: alloc is zeroed and aligned, transfers round-trip, bf16 is refused", "[cpu][memory]") {
  CpuOps ops;
  CHECK(ops.device() == Device::cpu);
  CHECK(ops.compute_dtype() == DType::f32);
  CHECK(ops.device_description().find("cpu") == 0);

  for (DType dtype : {DType::f32, DType::i32}) {
    Tensor t = ops.alloc(1001, dtype);
    CHECK(t.numel == 1001);
    CHECK(t.dtype == dtype);
    CHECK(reinterpret_cast<uintptr_t>(t.data) % 64 == 0);
    const char* bytes = static_cast<const char*>(t.data);
    CHECK(std::all_of(bytes, bytes + t.bytes(), [](char c) { return c == 0; }));
    ops.release(t);
    CHECK(t.data == nullptr);
  }
  Tensor empty = ops.alloc(0, DType::f32);
  CHECK(empty.numel == 0);
  ops.release(empty);

  try {
    ops.alloc(10, DType::bf16);
    FAIL("alloc(bf16) did not throw");
  } catch (const RuntimeError& e) {
    CHECK(std::string(e.what()).find("bf16") != std::string::npos);
  }

  Buffers bufs(ops);
  std::vector<float> f = random_floats(100, 40);
  Tensor tf = bufs.f32(f);
  CHECK(bitwise_equal(bufs.read(tf), f));
  std::vector<int32_t> ints = {3, -1, 7, 2147483647}, back(4);
  Tensor ti = bufs.i32(ints);
  ops.download(back.data(), DType::i32, ti, 4);
  CHECK(back == ints);

  CHECK_THROWS_AS(ops.upload(tf, ints.data(), DType::i32, 4), RuntimeError);   // dtype mismatch
  CHECK_THROWS_AS(ops.upload(tf, f.data(), DType::bf16, 4), RuntimeError);     // no conversion on the CPU
  CHECK_THROWS_AS(ops.download(f.data(), DType::f32, tf, 101), RuntimeError);  // more than it holds

  Tensor copy = bufs.zeros(100);
  ops.copy(copy, tf, 100);
  CHECK(bitwise_equal(bufs.read(copy), f));
  CHECK_THROWS_AS(ops.copy(copy, ti, 4), RuntimeError);
  ops.copy(copy.slice(0, 50), copy.slice(25, 50), 50);  // overlapping slices of one buffer
  CHECK(bufs.read(copy)[0] == f[25]);
  ops.zero(copy);
  CHECK(bufs.read(copy) == std::vector<float>(100, 0.0f));
  ops.synchronize();
}

TEST_CASE("cpu ops check their arguments", "[cpu][memory]") {
  CpuOps ops;
  Buffers bufs(ops);
  Tensor x = bufs.zeros(6), w = bufs.zeros(6), out = bufs.zeros(3);
  CHECK_THROWS_AS(ops.matmul_forward(out, x, w, Tensor{}, 2, 3, 2), RuntimeError);  // out needs 4
  Tensor ints = bufs.zeros(6, DType::i32);
  CHECK_THROWS_AS(ops.gelu_forward(x, ints, 6), RuntimeError);  // i32 where f32 is expected
  CHECK_THROWS_AS(ops.layernorm_forward(x, Tensor{}, Tensor{}, x, w, w, -2, 3), RuntimeError);
}

TEST_CASE("gelu: forward is GPT-2's tanh approximation, backward matches finite differences", "[cpu][elementwise]") {
  CpuOps ops;
  Buffers bufs(ops);
  std::vector<float> x = random_floats(1001, 41, -6.0f, 6.0f);
  x[0] = 0.0f, x[1] = -10.0f, x[2] = 10.0f;
  std::vector<float> R = random_floats(x.size(), 42);
  auto gelu = [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v))); };

  // Tolerance atol 1e-6, rtol 1e-5: one float tanh.
  Tensor t_x = bufs.f32(x), out = bufs.zeros(x.size());
  ops.gelu_forward(out, t_x, x.size());
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); i++) want[i] = gelu(x[i]);
  require_close(bufs.read(out), want, 1e-6, 1e-5, "gelu");

  // Tolerance atol 1e-5, rtol 1e-4 against the double derivative (by central differences).
  Tensor dx = bufs.zeros(x.size()), t_R = bufs.f32(R);
  auto backward = [&] { ops.gelu_backward(dx, t_x, t_R, x.size()); };
  backward();
  std::vector<double> dwant(x.size());
  const double h = 1e-5;
  for (size_t i = 0; i < x.size(); i++) dwant[i] = R[i] * (gelu(x[i] + h) - gelu(x[i] - h)) / (2 * h);
  require_close(bufs.read(dx), dwant, 1e-5, 1e-4, "dinp");
  check_overwrites(ops, bufs, {dx}, backward);
}

TEST_CASE("add and scale", "[cpu][elementwise]") {
  // Tolerance 0: one float operation per element, the same one the expectation does.
  CpuOps ops;
  Buffers bufs(ops);
  std::vector<float> a = random_floats(77, 43), b = random_floats(77, 44);
  Tensor ta = bufs.f32(a), tb = bufs.f32(b);
  ops.add(ta, ta, tb, a.size());  // out aliasing a
  std::vector<float> want(a.size());
  for (size_t i = 0; i < a.size(); i++) want[i] = a[i] + b[i];
  CHECK(bitwise_equal(bufs.read(ta), want));
  ops.scale(ta, -0.375f, a.size());
  for (float& v : want) v *= -0.375f;
  CHECK(bitwise_equal(bufs.read(ta), want));
}

namespace {

// -log softmax(row[:V])[target] in double.
double cross_entropy_ref(const double* row, int V, int target) {
  double mx = -INFINITY, sum = 0;
  for (int i = 0; i < V; i++) mx = std::max(mx, row[i]);
  for (int i = 0; i < V; i++) sum += std::exp(row[i] - mx);
  return std::log(sum) + mx - row[target];
}

}  // namespace

TEST_CASE("softmax_cross_entropy: losses, dlogits, padding, missing targets, eval", "[cpu][loss]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 6, V = 37, Vp = 40;
  std::vector<int32_t> targets = {3, -1, 36, 0, 17, -1};
  const float dloss = 0.25f;  // 1 / (number of rows with a target), as the trainer passes
  std::vector<float> logits = random_floats(size_t(N) * Vp, 45, -3.0f, 3.0f);
  for (int n = 0; n < N; n++)
    for (int i = V; i < Vp; i++) logits[size_t(n) * Vp + i] = 100.0f;  // padding must be ignored
  std::vector<double> logits_d = to_double(logits);
  auto loss_ref = [&](const std::vector<double>& lg, int n) {
    return targets[n] < 0 ? 0.0 : cross_entropy_ref(&lg[size_t(n) * Vp], V, targets[n]);
  };
  std::vector<double> want_losses(N);
  for (int n = 0; n < N; n++) want_losses[n] = loss_ref(logits_d, n);
  Tensor t_targets = bufs.i32(targets), losses = bufs.zeros(N);

  SECTION("dloss == 0 (eval): losses only, logits untouched") {
    // Tolerance 1e-5 (abs and rel): float log-sum-exp over 37 columns.
    Tensor t_logits = bufs.f32(logits);
    ops.softmax_cross_entropy(losses, t_logits, t_targets, N, V, Vp, 0.0f);
    require_close(bufs.read(losses), want_losses, 1e-5, 1e-5, "losses");
    CHECK(bitwise_equal(bufs.read(t_logits), logits));
  }

  SECTION("dloss != 0: logits become the gradient of dloss * sum(losses)") {
    Tensor t_logits = bufs.f32(logits);
    ops.softmax_cross_entropy(losses, t_logits, t_targets, N, V, Vp, dloss);
    require_close(bufs.read(losses), want_losses, 1e-5, 1e-5, "losses");
    std::vector<float> dlogits = bufs.read(t_logits);
    // Tolerance atol 1e-6, rtol 1e-4 against finite differences of the double loss. The
    // difference quotient of a padded column or a target-less row is exactly 0, and so must
    // the gradient be (checked with tolerance 0 below).
    auto total = [&](const std::vector<double>& lg) {
      double s = 0;
      for (int n = 0; n < N; n++) s += loss_ref(lg, n);
      return dloss * s;
    };
    require_close(dlogits, numeric_grad(total, logits_d), 1e-6, 1e-4, "dlogits");
    for (int n = 0; n < N; n++)
      for (int i = 0; i < Vp; i++) {
        if (i < V && targets[n] >= 0) continue;
        INFO("row " << n << ", column " << i);
        CHECK(dlogits[size_t(n) * Vp + i] == 0.0f);
      }
    for (int n = 0; n < N; n++)
      if (targets[n] < 0) CHECK(bufs.read(losses)[n] == 0.0f);
  }

  SECTION("large logits do not overflow (max subtraction)") {
    // exp(200) overflows float; the loss must stay finite and match the double reference on
    // the same float inputs. Tolerance 1e-5 (abs and rel).
    std::vector<float> big = logits;
    for (float& v : big) v += 200.0f;
    std::vector<double> big_d = to_double(big), want(N);
    for (int n = 0; n < N; n++) want[n] = loss_ref(big_d, n);
    ops.softmax_cross_entropy(losses, bufs.f32(big), t_targets, N, V, Vp, dloss);
    require_close(bufs.read(losses), want, 1e-5, 1e-5, "losses");
  }

  SECTION("a target past the vocabulary is an error") {
    std::vector<int32_t> bad = targets;
    bad[2] = V;  // a padded column is not a valid target either
    CHECK_THROWS_AS(ops.softmax_cross_entropy(losses, bufs.f32(logits), bufs.i32(bad), N, V, Vp, dloss), RuntimeError);
  }
}

TEST_CASE("adamw_update: two steps against a hand computation", "[cpu][optimizer]") {
  CpuOps ops;
  Buffers bufs(ops);
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.5f;
  std::vector<float> w0 = {0.5f, -1.0f, 2.0f, 0.0f};
  std::vector<float> g1 = {0.1f, -0.2f, 0.0f, 1.0f}, g2 = {-0.3f, 0.4f, 0.5f, 0.0f};

  // Step 1 by hand: mhat = g and vhat = g^2, so the step is lr * (sign(g) + wd * w) where g != 0
  // (eps shifts it by ~1e-7) and lr * wd * w where g == 0:
  //   0.5 - 0.01 * (1 + 0.05) = 0.4895;  -1 - 0.01 * (-1 - 0.1) = -0.989;
  //   2 - 0.01 * 0.2 = 1.998;            0 - 0.01 * (1 + 0) = -0.01.
  const std::vector<double> step1 = {0.4895, -0.989, 1.998, -0.01};

  // Step 2 in double, written out from the formula in ops.h.
  std::vector<double> w(w0.begin(), w0.end()), m(4, 0.0), v(4, 0.0);
  for (int t = 1; t <= 2; t++) {
    const std::vector<float>& g = t == 1 ? g1 : g2;
    for (int i = 0; i < 4; i++) {
      double gi = double(g[i]) * grad_scale;
      m[i] = b1 * m[i] + (1 - double(b1)) * gi;
      v[i] = b2 * v[i] + (1 - double(b2)) * gi * gi;
      double mhat = m[i] / (1 - std::pow(double(b1), t)), vhat = v[i] / (1 - std::pow(double(b2), t));
      w[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * w[i]);
    }
    if (t == 1) require_close(w, step1, 1e-6, 0.0, "hand-computed step 1 (the double reference itself)");
  }

  for (bool aliased : {true, false}) {
    DYNAMIC_SECTION((aliased ? "params aliasing master" : "separate params")) {
      Tensor master = bufs.f32(w0), tm = bufs.zeros(4), tv = bufs.zeros(4);
      Tensor params = aliased ? master : bufs.zeros(4);
      // Tolerance 1e-6 (abs): a handful of float operations on O(1) values.
      ops.adamw_update(params, master, bufs.f32(g1), tm, tv, 4, lr, b1, b2, eps, wd, 1, grad_scale);
      require_close(bufs.read(master), step1, 1e-6, 0.0, "master after step 1");
      ops.adamw_update(params, master, bufs.f32(g2), tm, tv, 4, lr, b1, b2, eps, wd, 2, grad_scale);
      require_close(bufs.read(master), w, 1e-6, 0.0, "master after step 2");
      require_close(bufs.read(tm), m, 1e-7, 1e-6, "m");
      require_close(bufs.read(tv), v, 1e-9, 1e-5, "v");
      CHECK(bitwise_equal(bufs.read(params), bufs.read(master)));
    }
  }
  Tensor one = bufs.zeros(1);
  CHECK_THROWS_AS(ops.adamw_update(one, one, one, one, one, 1, lr, b1, b2, eps, wd, 0, 1.0f), RuntimeError);
}

TEST_CASE("sum and sum_squares are exact on integers and independent of the thread count", "[cpu][reduction]") {
  CpuOps ops;
  Buffers bufs(ops);
  // 1..n in float is exact (n < 2^24) and every partial sum is an integer below 2^53:
  // the double results must be exact (tolerance 0). n spans several chunks and a remainder.
  const size_t n = 100003;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i++) x[i] = float(i + 1);
  Tensor t = bufs.f32(x);
  const double N = double(n);
  CHECK(ops.sum(t, n) == N * (N + 1) / 2);
  CHECK(ops.sum_squares(t, n) == N * (N + 1) * (2 * N + 1) / 6);
  CHECK(ops.sum(t, 0) == 0.0);

  Tensor r = bufs.f32(random_floats(1000003, 46));
  auto run = [&] { return std::vector<double>{ops.sum(r, r.numel), ops.sum_squares(r, r.numel)}; };
  auto reference = with_threads(1, run);
  for (int threads : kThreadCounts) CHECK(with_threads(threads, run) == reference);  // bitwise
}

TEST_CASE("elementwise and loss results do not depend on the thread count", "[cpu][determinism]") {
  // Bitwise: each element or row is computed by one thread. Sizes are above the point where
  // the ops go parallel.
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 64, V = 1000, Vp = 1024;
  const size_t n = size_t(1) << 17;
  Tensor x = bufs.f32(random_floats(n, 47, -4.0f, 4.0f)), dy = bufs.f32(random_floats(n, 48));
  std::vector<float> logits = random_floats(size_t(N) * Vp, 49, -5.0f, 5.0f);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; i++) targets[i] = (i * 37) % V - (i % 9 == 0 ? V : 0);  // some rows without a target
  Tensor t_targets = bufs.i32(targets);
  auto run = [&] {
    Tensor out = bufs.zeros(n), dx = bufs.zeros(n), losses = bufs.zeros(N), lg = bufs.f32(logits);
    ops.gelu_forward(out, x, n);
    ops.gelu_backward(dx, x, dy, n);
    ops.softmax_cross_entropy(losses, lg, t_targets, N, V, Vp, 1.0f / N);
    return std::vector<std::vector<float>>{bufs.read(out), bufs.read(dx), bufs.read(losses), bufs.read(lg)};
  };
  check_thread_count_independent(run);
}

TEST_CASE("matmul throughput", "[.][bench]") {
  // Hidden (run with: test_cpu_ops "[bench]"): prints GFLOP/s for the shape the CPU backend is
  // judged on. Not a pass/fail test: CI machines are shared and their speed varies.
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 512, IC = 512, OC = 2048;
  Tensor x = bufs.f32(random_floats(size_t(N) * IC, 50)), w = bufs.f32(random_floats(size_t(OC) * IC, 51)),
         b = bufs.f32(random_floats(OC, 52)), y = bufs.zeros(size_t(N) * OC), dy = bufs.f32(random_floats(size_t(N) * OC, 53)),
         dx = bufs.zeros(size_t(N) * IC), dw = bufs.zeros(size_t(OC) * IC), db = bufs.zeros(OC);
  auto gflops = [&](double flops, auto f) {
    f();  // warm up (page faults, packing buffers)
    const int reps = 10;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; r++) f();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    return flops / s * 1e-9;
  };
  double f = 2.0 * N * IC * OC;
  double fwd = gflops(f, [&] { ops.matmul_forward(y, x, w, b, N, IC, OC); });
  double bwd = gflops(2 * f, [&] { ops.matmul_backward(dx, dw, db, dy, x, w, N, IC, OC); });
  std::cout << ops.device_description() << ", N=" << N << " IC=" << IC << " OC=" << OC << ": forward " << fwd
            << " GFLOP/s, backward " << bwd << " GFLOP/s\n";
  CHECK(fwd > 0);
}
