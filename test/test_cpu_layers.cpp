// CpuOps embedding, position, LayerNorm and matmul: forward against a double-precision
// reference written here, backward against central finite differences of that reference
// (loss L = sum(out * R) for a fixed random R, so dout = R), the += semantics of every
// gradient, null gradients skipped, and bitwise determinism across thread counts.
// Shapes are deliberately awkward (7, 13, 11, ...) so no loop can get away with a remainder bug.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "cpu_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

std::vector<double> embedding_ref(const std::vector<int32_t>& tokens, const std::vector<double>& wte, int C,
                                  int vocab_start, int vocab_local) {
  std::vector<double> out(tokens.size() * C, 0.0);
  for (size_t n = 0; n < tokens.size(); n++) {
    int row = tokens[n] - vocab_start;
    if (row < 0 || row >= vocab_local) continue;
    for (int c = 0; c < C; c++) out[n * C + c] = wte[size_t(row) * C + c];
  }
  return out;
}

// The part of position_forward's output that depends on wpe.
std::vector<double> position_ref(const std::vector<double>& wpe, const std::vector<int32_t>& pos, int B, int C) {
  int T = int(pos.size());
  std::vector<double> out(size_t(B) * T * C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++) out[(size_t(b) * T + t) * C + c] = wpe[size_t(pos[t]) * C + c];
  return out;
}

struct LayerNormRef {
  std::vector<double> out, mean, rstd;
};

LayerNormRef layernorm_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                           int N, int C) {
  LayerNormRef r{std::vector<double>(x.size()), std::vector<double>(N), std::vector<double>(N)};
  for (int n = 0; n < N; n++) {
    const double* xr = &x[size_t(n) * C];
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += xr[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
    v /= C;  // biased, as GPT-2
    double rs = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; c++) r.out[size_t(n) * C + c] = (xr[c] - m) * rs * w[c] + b[c];
    r.mean[n] = m;
    r.rstd[n] = rs;
  }
  return r;
}

// out[N, OC] = x[N, IC] @ w[OC, IC]^T + bias (bias empty: none).
std::vector<double> matmul_ref(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>& bias, int N, int IC, int OC) {
  std::vector<double> out(size_t(N) * OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int i = 0; i < IC; i++) s += x[size_t(n) * IC + i] * w[size_t(o) * IC + i];
      out[size_t(n) * OC + o] = s;
    }
  return out;
}

}  // namespace

TEST_CASE("embedding: forward copies this shard's rows, backward matches finite differences", "[cpu][embedding]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 9, C = 13, vocab_start = 5, vocab_local = 10;
  // 0 and 4 fall below the shard, 15 and 20 above it; 7 repeats (the scatter-add must sum it).
  std::vector<int32_t> tokens = {5, 14, 0, 4, 15, 7, 7, 20, 9};
  std::vector<float> wte = random_floats(size_t(vocab_local) * C, 1);
  std::vector<float> R = random_floats(size_t(N) * C, 2);
  // One guard row past the shard in both tables: an off-by-one in the range test would read
  // it (forward) or write it (backward) instead of running off the buffer unnoticed.
  std::vector<float> wte_guarded = wte;
  wte_guarded.resize(wte.size() + C, 99.0f);
  Tensor t_tok = bufs.i32(tokens), t_wte = bufs.f32(wte_guarded);

  // Tolerance 0: forward is a copy (and zeros for other shards' tokens).
  Tensor out = bufs.f32(random_floats(size_t(N) * C, 3));  // forward must overwrite, not add
  ops.embedding_forward(out, t_tok, t_wte, N, C, vocab_start, vocab_local);
  require_close(bufs.read(out), embedding_ref(tokens, to_double(wte), C, vocab_start, vocab_local), 0.0, 0.0, "out");

  // Tolerance 1e-6: each gradient element is a sum of at most two floats.
  Tensor dwte = bufs.zeros(wte.size() + C);
  ops.embedding_backward(dwte, bufs.f32(R), t_tok, N, C, vocab_start, vocab_local);
  auto loss = [&](const std::vector<double>& w) { return dot(embedding_ref(tokens, w, C, vocab_start, vocab_local), R); };
  std::vector<double> want = numeric_grad(loss, to_double(wte));
  want.resize(wte.size() + C, 0.0);  // the guard row stays 0
  require_close(bufs.read(dwte), want, 1e-6, 1e-6, "dwte");

  check_accumulates(ops, bufs, {dwte}, [&] { ops.embedding_backward(dwte, bufs.f32(R), t_tok, N, C, vocab_start, vocab_local); });
  ops.embedding_backward(Tensor{}, bufs.f32(R), t_tok, N, C, vocab_start, vocab_local);  // null: skipped
}

TEST_CASE("position: forward adds wpe[pos[t]], backward matches finite differences", "[cpu][embedding]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int B = 2, T = 5, C = 7, rows = 9;
  std::vector<int32_t> pos = {3, 0, 8, 4, 6};  // not 0..T-1, as under context parallelism
  std::vector<float> wpe = random_floats(size_t(rows) * C, 4);
  std::vector<float> base = random_floats(size_t(B) * T * C, 5);
  std::vector<float> R = random_floats(base.size(), 6);
  Tensor t_pos = bufs.i32(pos), t_wpe = bufs.f32(wpe);

  // Tolerance 0: one float add per element, the same add the reference does.
  Tensor out = bufs.f32(base);
  ops.position_forward(out, t_wpe, t_pos, B, T, C);
  std::vector<double> added = position_ref(to_double(wpe), pos, B, C);
  std::vector<float> want(base.size());
  for (size_t i = 0; i < want.size(); i++) want[i] = base[i] + float(added[i]);
  require_close(bufs.read(out), want, 0.0, 0.0, "out");

  // Tolerance 1e-6: each gradient element sums B = 2 floats.
  Tensor dwpe = bufs.zeros(wpe.size());
  ops.position_backward(dwpe, bufs.f32(R), t_pos, B, T, C);
  auto loss = [&](const std::vector<double>& w) { return dot(position_ref(w, pos, B, C), R); };
  require_close(bufs.read(dwpe), numeric_grad(loss, to_double(wpe)), 1e-6, 1e-6, "dwpe");

  check_accumulates(ops, bufs, {dwpe}, [&] { ops.position_backward(dwpe, bufs.f32(R), t_pos, B, T, C); });
  std::vector<int32_t> bad = {3, 0, 9, 4, 6};  // 9 is past wpe's rows
  CHECK_THROWS_AS(ops.position_forward(out, t_wpe, bufs.i32(bad), B, T, C), RuntimeError);
}

TEST_CASE("layernorm: forward matches a double reference, backward matches finite differences", "[cpu][layernorm]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 7, C = 13;
  std::vector<float> x = random_floats(size_t(N) * C, 7);
  for (int n = 0; n < N; n++)  // rows with a mean far from 0, which a one-pass variance would mangle
    for (int c = 0; c < C; c++) x[size_t(n) * C + c] += 3.0f * (n - 3);
  std::vector<float> w = random_floats(C, 8, 0.5f, 1.5f), b = random_floats(C, 9);
  std::vector<float> R = random_floats(x.size(), 10);
  Tensor t_x = bufs.f32(x), t_w = bufs.f32(w), t_b = bufs.f32(b);
  Tensor out = bufs.zeros(x.size()), mean = bufs.zeros(N), rstd = bufs.zeros(N);

  // Tolerance 1e-5 (abs and rel): float sums over 13 channels of O(1) values.
  ops.layernorm_forward(out, mean, rstd, t_x, t_w, t_b, N, C);
  LayerNormRef ref = layernorm_ref(to_double(x), to_double(w), to_double(b), N, C);
  require_close(bufs.read(out), ref.out, 1e-5, 1e-5, "out");
  require_close(bufs.read(mean), ref.mean, 1e-5, 1e-5, "mean");
  require_close(bufs.read(rstd), ref.rstd, 1e-5, 1e-5, "rstd");

  // Tolerance atol 1e-5, rtol 1e-4: the float backward against exact double derivatives.
  Tensor t_R = bufs.f32(R);
  Tensor dx = bufs.zeros(x.size()), dw = bufs.zeros(C), db = bufs.zeros(C);
  auto backward = [&] { ops.layernorm_backward(dx, dw, db, t_R, t_x, t_w, mean, rstd, N, C); };
  backward();
  std::vector<double> xd = to_double(x), wd = to_double(w), bd = to_double(b);
  require_close(bufs.read(dx), numeric_grad([&](const std::vector<double>& v) { return dot(layernorm_ref(v, wd, bd, N, C).out, R); }, xd),
                1e-5, 1e-4, "dinp");
  require_close(bufs.read(dw), numeric_grad([&](const std::vector<double>& v) { return dot(layernorm_ref(xd, v, bd, N, C).out, R); }, wd),
                1e-5, 1e-4, "dw");
  require_close(bufs.read(db), numeric_grad([&](const std::vector<double>& v) { return dot(layernorm_ref(xd, wd, v, N, C).out, R); }, bd),
                1e-5, 1e-4, "db");

  check_accumulates(ops, bufs, {dx, dw, db}, backward);

  SECTION("null gradients are skipped and do not change the others") {
    Tensor dx_all = bufs.zeros(x.size()), dw_all = bufs.zeros(C), db_all = bufs.zeros(C);
    ops.layernorm_backward(dx_all, dw_all, db_all, t_R, t_x, t_w, mean, rstd, N, C);
    Tensor dx_only = bufs.zeros(x.size()), dw_only = bufs.zeros(C);
    ops.layernorm_backward(dx_only, Tensor{}, Tensor{}, t_R, t_x, t_w, mean, rstd, N, C);
    ops.layernorm_backward(Tensor{}, dw_only, Tensor{}, t_R, t_x, Tensor{}, mean, rstd, N, C);  // w unused
    CHECK(bitwise_equal(bufs.read(dx_only), bufs.read(dx_all)));
    CHECK(bitwise_equal(bufs.read(dw_only), bufs.read(dw_all)));
  }
}

TEST_CASE("residual_layernorm_forward: bitwise add + layernorm_forward, residual may alias a", "[cpu][layernorm]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 5, C = 11;  // awkward on purpose
  const size_t NC = size_t(N) * C;
  std::vector<float> a = random_floats(NC, 21), b = random_floats(NC, 22);
  for (size_t i = 0; i < NC; i++) a[i] += 4.0f;  // a residual stream whose mean is far from 0
  std::vector<float> w = random_floats(C, 23, 0.5f, 1.5f), bias = random_floats(C, 24);
  Tensor t_a = bufs.f32(a), t_b = bufs.f32(b), t_w = bufs.f32(w), t_bias = bufs.f32(bias);
  const std::vector<float> poison(NC, std::nanf(""));

  // The unfused reference: the two ops the fused one stands for.
  Tensor ref_res = bufs.zeros(NC), ref_out = bufs.zeros(NC), ref_mean = bufs.zeros(N), ref_rstd = bufs.zeros(N);
  ops.add(ref_res, t_a, t_b, NC);
  ops.layernorm_forward(ref_out, ref_mean, ref_rstd, ref_res, t_w, t_bias, N, C);
  std::vector<double> res_d(NC);
  for (size_t i = 0; i < NC; i++) res_d[i] = double(a[i]) + double(b[i]);
  LayerNormRef ref = layernorm_ref(res_d, to_double(w), to_double(bias), N, C);
  require_close(bufs.read(ref_out), ref.out, 1e-5, 1e-5, "reference out");

  auto check_same = [&](Tensor res, Tensor out, Tensor mean, Tensor rstd) {
    CHECK(bitwise_equal(bufs.read(res), bufs.read(ref_res)));
    CHECK(bitwise_equal(bufs.read(out), bufs.read(ref_out)));
    if (mean) CHECK(bitwise_equal(bufs.read(mean), bufs.read(ref_mean)));
    if (rstd) CHECK(bitwise_equal(bufs.read(rstd), bufs.read(ref_rstd)));
  };

  SECTION("separate residual") {
    Tensor res = bufs.f32(poison), out = bufs.f32(poison);
    Tensor mean = bufs.f32(std::vector<float>(N, std::nanf(""))), rstd = bufs.f32(std::vector<float>(N, std::nanf("")));
    ops.residual_layernorm_forward(res, out, mean, rstd, t_a, t_b, t_w, t_bias, N, C);
    check_same(res, out, mean, rstd);
    CHECK(bitwise_equal(bufs.read(t_a), a));  // inputs untouched
    CHECK(bitwise_equal(bufs.read(t_b), b));
  }
  SECTION("residual aliases a (in place on the stream)") {
    Tensor stream = bufs.f32(a), out = bufs.f32(poison), mean = bufs.zeros(N), rstd = bufs.zeros(N);
    ops.residual_layernorm_forward(stream, out, mean, rstd, stream, t_b, t_w, t_bias, N, C);
    check_same(stream, out, mean, rstd);
  }
  SECTION("residual aliases b") {
    Tensor stream = bufs.f32(b), out = bufs.f32(poison), mean = bufs.zeros(N), rstd = bufs.zeros(N);
    ops.residual_layernorm_forward(stream, out, mean, rstd, t_a, stream, t_w, t_bias, N, C);
    check_same(stream, out, mean, rstd);
  }
  SECTION("null statistics (evaluation)") {
    Tensor res = bufs.f32(poison), out = bufs.f32(poison);
    ops.residual_layernorm_forward(res, out, Tensor{}, Tensor{}, t_a, t_b, t_w, t_bias, N, C);
    check_same(res, out, Tensor{}, Tensor{});
  }
  SECTION("row slices of larger buffers") {
    // Rows 1..N-1 of each tensor: the op reads and writes exactly N-1 rows at the given offsets.
    Tensor res = bufs.f32(poison), out = bufs.f32(poison);
    ops.residual_layernorm_forward(res.slice(C, NC - C), out.slice(C, NC - C), Tensor{}, Tensor{},
                                   t_a.slice(C, NC - C), t_b.slice(C, NC - C), t_w, t_bias, N - 1, C);
    std::vector<float> got_res = bufs.read(res), got_out = bufs.read(out);
    std::vector<float> want_res = bufs.read(ref_res), want_out = bufs.read(ref_out);
    for (int c = 0; c < C; c++) {  // the first row is not written
      CHECK(std::isnan(got_res[size_t(c)]));
      CHECK(std::isnan(got_out[size_t(c)]));
    }
    CHECK(bitwise_equal(std::vector<float>(got_res.begin() + C, got_res.end()),
                        std::vector<float>(want_res.begin() + C, want_res.end())));
    CHECK(bitwise_equal(std::vector<float>(got_out.begin() + C, got_out.end()),
                        std::vector<float>(want_out.begin() + C, want_out.end())));
  }
}

TEST_CASE("matmul: forward matches a double reference, backward matches finite differences", "[cpu][matmul]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 7, IC = 13, OC = 11;
  std::vector<float> x = random_floats(size_t(N) * IC, 11), w = random_floats(size_t(OC) * IC, 12),
                     bias = random_floats(OC, 13), R = random_floats(size_t(N) * OC, 14);
  Tensor t_x = bufs.f32(x), t_w = bufs.f32(w), t_R = bufs.f32(R);
  std::vector<double> xd = to_double(x), wd = to_double(w), bd = to_double(bias);

  for (bool with_bias : {true, false}) {
    DYNAMIC_SECTION("bias " << (with_bias ? "on" : "off")) {
      Tensor t_bias = with_bias ? bufs.f32(bias) : Tensor{};
      std::vector<double> bref = with_bias ? bd : std::vector<double>{};
      // Tolerance 1e-5 (abs and rel): float dot products of 13 O(1) terms.
      Tensor out = bufs.f32(random_floats(size_t(N) * OC, 15));  // forward overwrites
      ops.matmul_forward(out, t_x, t_w, t_bias, N, IC, OC);
      require_close(bufs.read(out), matmul_ref(xd, wd, bref, N, IC, OC), 1e-5, 1e-5, "out");

      // Tolerance 1e-5 (abs and rel) against exact double derivatives.
      Tensor dx = bufs.zeros(x.size()), dw = bufs.zeros(w.size()), db = with_bias ? bufs.zeros(OC) : Tensor{};
      auto backward = [&] { ops.matmul_backward(dx, dw, db, t_R, t_x, t_w, N, IC, OC); };
      backward();
      require_close(bufs.read(dx), numeric_grad([&](const std::vector<double>& v) { return dot(matmul_ref(v, wd, bref, N, IC, OC), R); }, xd),
                    1e-5, 1e-5, "dinp");
      require_close(bufs.read(dw), numeric_grad([&](const std::vector<double>& v) { return dot(matmul_ref(xd, v, bref, N, IC, OC), R); }, wd),
                    1e-5, 1e-5, "dw");
      if (with_bias)
        require_close(bufs.read(db), numeric_grad([&](const std::vector<double>& v) { return dot(matmul_ref(xd, wd, v, N, IC, OC), R); }, bd),
                      1e-5, 1e-5, "dbias");
      std::vector<Tensor> grads = {dw};  // parameter gradients accumulate, dinp is overwritten
      if (with_bias) grads.push_back(db);
      check_accumulates(ops, bufs, grads, backward);
      check_overwrites(ops, bufs, {dx}, backward);
    }
  }

  SECTION("each gradient alone equals its part of the full call (null ones skipped)") {
    Tensor dx = bufs.zeros(x.size()), dw = bufs.zeros(w.size()), db = bufs.zeros(OC);
    ops.matmul_backward(dx, dw, db, t_R, t_x, t_w, N, IC, OC);
    Tensor dx1 = bufs.zeros(x.size()), dw1 = bufs.zeros(w.size()), db1 = bufs.zeros(OC);
    ops.matmul_backward(dx1, Tensor{}, Tensor{}, t_R, t_x, t_w, N, IC, OC);
    ops.matmul_backward(Tensor{}, dw1, Tensor{}, t_R, t_x, t_w, N, IC, OC);
    ops.matmul_backward(Tensor{}, Tensor{}, db1, t_R, t_x, t_w, N, IC, OC);
    CHECK(bitwise_equal(bufs.read(dx), bufs.read(dx1)));
    CHECK(bitwise_equal(bufs.read(dw), bufs.read(dw1)));
    CHECK(bitwise_equal(bufs.read(db), bufs.read(db1)));
  }
}

TEST_CASE("matmul: shapes crossing every tile and K block agree with a double reference", "[cpu][matmul]") {
  // 131 rows (64-row tiles + 3-row remainder group), IC = 300 (a 256 K block + 44),
  // OC = 141 (a 128-column tile + a 13-column remainder panel); dw has K = N = 131.
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 131, IC = 300, OC = 141;
  std::vector<float> x = random_floats(size_t(N) * IC, 16), w = random_floats(size_t(OC) * IC, 17),
                     bias = random_floats(OC, 18), R = random_floats(size_t(N) * OC, 19);
  std::vector<double> xd = to_double(x), wd = to_double(w), Rd = to_double(R);
  Tensor t_x = bufs.f32(x), t_w = bufs.f32(w), t_R = bufs.f32(R);

  // Tolerance atol 1e-4, rtol 1e-4: float sums of 131-300 products of O(1) values.
  Tensor out = bufs.zeros(size_t(N) * OC);
  ops.matmul_forward(out, t_x, t_w, bufs.f32(bias), N, IC, OC);
  require_close(bufs.read(out), matmul_ref(xd, wd, to_double(bias), N, IC, OC), 1e-4, 1e-4, "out");

  Tensor dx = bufs.zeros(x.size()), dw = bufs.zeros(w.size()), db = bufs.zeros(OC);
  ops.matmul_backward(dx, dw, db, t_R, t_x, t_w, N, IC, OC);
  std::vector<double> dx_ref(x.size(), 0.0), dw_ref(w.size(), 0.0), db_ref(OC, 0.0);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double g = Rd[size_t(n) * OC + o];
      db_ref[o] += g;
      for (int i = 0; i < IC; i++) {
        dx_ref[size_t(n) * IC + i] += g * wd[size_t(o) * IC + i];
        dw_ref[size_t(o) * IC + i] += g * xd[size_t(n) * IC + i];
      }
    }
  require_close(bufs.read(dx), dx_ref, 1e-4, 1e-4, "dinp");
  require_close(bufs.read(dw), dw_ref, 1e-4, 1e-4, "dw");
  require_close(bufs.read(db), db_ref, 1e-4, 1e-4, "dbias");
}

TEST_CASE("embedding, LayerNorm and matmul results do not depend on the thread count", "[cpu][determinism]") {
  // Bitwise: every output element is computed by one thread in a fixed order.
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 150, C = 97, IC = 300, OC = 200, V = 40;
  std::vector<int32_t> tokens(N);
  for (int n = 0; n < N; n++) tokens[n] = (n * 7) % V;  // every row of wte hit several times
  Tensor t_tok = bufs.i32(tokens), dout_c = bufs.f32(random_floats(size_t(N) * C, 20));
  Tensor x_c = bufs.f32(random_floats(size_t(N) * C, 21)), w_c = bufs.f32(random_floats(C, 22)),
         b_c = bufs.f32(random_floats(C, 23));
  Tensor x = bufs.f32(random_floats(size_t(N) * IC, 24)), w = bufs.f32(random_floats(size_t(OC) * IC, 25)),
         bias = bufs.f32(random_floats(OC, 26)), dout = bufs.f32(random_floats(size_t(N) * OC, 27));

  auto run = [&] {
    std::vector<std::vector<float>> results;
    Tensor dwte = bufs.zeros(size_t(V) * C);
    ops.embedding_backward(dwte, dout_c, t_tok, N, C, 0, V);
    results.push_back(bufs.read(dwte));
    Tensor ln = bufs.zeros(size_t(N) * C), mean = bufs.zeros(N), rstd = bufs.zeros(N);
    ops.layernorm_forward(ln, mean, rstd, x_c, w_c, b_c, N, C);
    Tensor dx_c = bufs.zeros(size_t(N) * C), dw_c = bufs.zeros(C), db_c = bufs.zeros(C);
    ops.layernorm_backward(dx_c, dw_c, db_c, dout_c, x_c, w_c, mean, rstd, N, C);
    for (Tensor t : {ln, mean, rstd, dx_c, dw_c, db_c}) results.push_back(bufs.read(t));
    Tensor out = bufs.zeros(size_t(N) * OC), dx = bufs.zeros(size_t(N) * IC), dw = bufs.zeros(size_t(OC) * IC),
           db = bufs.zeros(OC);
    ops.matmul_forward(out, x, w, bias, N, IC, OC);
    ops.matmul_backward(dx, dw, db, dout, x, w, N, IC, OC);
    for (Tensor t : {out, dx, dw, db}) results.push_back(bufs.read(t));
    return results;
  };
  check_thread_count_independent(run);
}
