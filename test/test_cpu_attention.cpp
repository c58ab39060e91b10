// CpuOps causal self-attention: forward and lse against a naive double implementation that
// builds the full T x T score matrix, masks it and softmaxes it; backward (which recomputes
// the probabilities from q, k and lse) against central finite differences of that naive
// forward; += semantics; bitwise determinism across thread counts.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "cpu_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

struct AttentionRef {
  std::vector<double> out;  // [B, T, C]
  std::vector<double> lse;  // [B, NH, T]
};

// The textbook definition, nothing shared with the implementation under test.
AttentionRef attention_ref(const std::vector<double>& qkv, int B, int T, int C, int NH) {
  int HS = C / NH;
  double scale = 1.0 / std::sqrt(double(HS));
  AttentionRef r{std::vector<double>(size_t(B) * T * C), std::vector<double>(size_t(B) * NH * T)};
  std::vector<double> S(size_t(T) * T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      auto q = [&](int t, int c) { return qkv[(size_t(b) * T + t) * 3 * C + h * HS + c]; };
      auto k = [&](int t, int c) { return qkv[(size_t(b) * T + t) * 3 * C + C + h * HS + c]; };
      auto v = [&](int t, int c) { return qkv[(size_t(b) * T + t) * 3 * C + 2 * C + h * HS + c]; };
      for (int t = 0; t < T; t++)
        for (int j = 0; j < T; j++) {
          double s = 0;
          for (int c = 0; c < HS; c++) s += q(t, c) * k(j, c);
          S[size_t(t) * T + j] = j <= t ? s * scale : -INFINITY;  // causal mask
        }
      for (int t = 0; t < T; t++) {
        double* row = &S[size_t(t) * T];
        double sum = 0;
        for (int j = 0; j < T; j++) sum += std::exp(row[j]);  // exp(-inf) = 0
        r.lse[(size_t(b) * NH + h) * T + t] = std::log(sum);
        for (int c = 0; c < HS; c++) {
          double o = 0;
          for (int j = 0; j < T; j++) o += std::exp(row[j]) / sum * v(j, c);
          r.out[(size_t(b) * T + t) * C + h * HS + c] = o;
        }
      }
    }
  return r;
}

}  // namespace

TEST_CASE("attention: forward, lse and backward against a naive full-softmax reference", "[cpu][attention]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int B = 2, T = 11, C = 15, NH = 3;  // HS = 5
  std::vector<float> qkv = random_floats(size_t(B) * T * 3 * C, 31, -1.5f, 1.5f);
  std::vector<float> R = random_floats(size_t(B) * T * C, 32);
  std::vector<double> qkvd = to_double(qkv);
  Tensor t_qkv = bufs.f32(qkv), out = bufs.zeros(size_t(B) * T * C), lse = bufs.zeros(size_t(B) * NH * T);

  // Tolerance 1e-5 (abs and rel): float softmax over at most 11 keys of 5-channel dot products.
  ops.attention_forward(out, lse, t_qkv, B, T, C, NH, NH);
  AttentionRef ref = attention_ref(qkvd, B, T, C, NH);
  require_close(bufs.read(out), ref.out, 1e-5, 1e-5, "out");
  require_close(bufs.read(lse), ref.lse, 1e-5, 1e-5, "lse");

  // Tolerance atol 1e-5, rtol 1e-4: float backward against exact double derivatives.
  Tensor dqkv = bufs.zeros(qkv.size()), t_R = bufs.f32(R);
  auto backward = [&] { ops.attention_backward(dqkv, t_R, t_qkv, out, lse, B, T, C, NH, NH); };
  backward();
  auto loss = [&](const std::vector<double>& v) { return dot(attention_ref(v, B, T, C, NH).out, R); };
  require_close(bufs.read(dqkv), numeric_grad(loss, qkvd), 1e-5, 1e-4, "dqkv");

  check_overwrites(ops, bufs, {dqkv}, backward);
  ops.attention_backward(Tensor{}, t_R, t_qkv, out, lse, B, T, C, NH, NH);               // null: skipped
  CHECK_THROWS_AS(ops.attention_forward(out, lse, t_qkv, B, T, C, 4, 4), RuntimeError);  // 4 does not divide 15
}

TEST_CASE("attention: a single token attends only to itself", "[cpu][attention]") {
  // T = 1: out = v exactly, lse = the one score; backward gives dv = dout and dq = dk = 0.
  // Tolerance 1e-6 (abs): p = exp(s - lse) = 1 up to float rounding.
  CpuOps ops;
  Buffers bufs(ops);
  const int B = 3, T = 1, C = 8, NH = 2;
  std::vector<float> qkv = random_floats(size_t(B) * 3 * C, 33), R = random_floats(size_t(B) * C, 34);
  Tensor t_qkv = bufs.f32(qkv), out = bufs.zeros(size_t(B) * C), lse = bufs.zeros(size_t(B) * NH);
  ops.attention_forward(out, lse, t_qkv, B, T, C, NH, NH);
  Tensor dqkv = bufs.zeros(qkv.size());
  ops.attention_backward(dqkv, bufs.f32(R), t_qkv, out, lse, B, T, C, NH, NH);
  std::vector<double> want_out(size_t(B) * C), want_d(qkv.size(), 0.0);
  for (int b = 0; b < B; b++)
    for (int c = 0; c < C; c++) {
      want_out[size_t(b) * C + c] = qkv[size_t(b) * 3 * C + 2 * C + c];
      want_d[size_t(b) * 3 * C + 2 * C + c] = R[size_t(b) * C + c];
    }
  require_close(bufs.read(out), want_out, 1e-6, 0.0, "out");
  require_close(bufs.read(dqkv), want_d, 1e-6, 0.0, "dqkv");
}

TEST_CASE("attention results do not depend on the thread count", "[cpu][determinism]") {
  // Bitwise: forward rows are owned by one thread each, backward (b, head) pairs likewise.
  CpuOps ops;
  Buffers bufs(ops);
  const int B = 3, T = 37, C = 48, NH = 4;
  Tensor qkv = bufs.f32(random_floats(size_t(B) * T * 3 * C, 35, -2.0f, 2.0f));
  Tensor dout = bufs.f32(random_floats(size_t(B) * T * C, 36));
  auto run = [&] {
    Tensor out = bufs.zeros(size_t(B) * T * C), lse = bufs.zeros(size_t(B) * NH * T), dqkv = bufs.zeros(qkv.numel);
    ops.attention_forward(out, lse, qkv, B, T, C, NH, NH);
    ops.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NH);
    return std::vector<std::vector<float>>{bufs.read(out), bufs.read(lse), bufs.read(dqkv)};
  };
  check_thread_count_independent(run);
}
