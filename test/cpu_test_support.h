// Helpers shared by the CpuOps tests (test_cpu_*.cpp): random data, tensors that free
// themselves, central finite differences in double, a tolerance check that names the worst
// element, and a thread-count switch for the determinism tests.
#pragma once
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/cpu_ops.h"

namespace pt::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// n token ids in [0, vocab).
inline std::vector<int32_t> random_tokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Rows [r0, r0 + n) of a row-major matrix with `cols` columns.
inline std::vector<float> rows_of(const std::vector<float>& m, int cols, int r0, int n) {
  return {m.begin() + size_t(r0) * cols, m.begin() + size_t(r0 + n) * cols};
}

// Columns [c0, c0 + n) of a row-major [rows, cols] matrix, as a contiguous [rows, n] one.
inline std::vector<float> cols_of(const std::vector<float>& m, int rows, int cols, int c0, int n) {
  std::vector<float> out(size_t(rows) * n);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < n; c++) out[size_t(r) * n + c] = m[size_t(r) * cols + c0 + c];
  return out;
}

// CpuOps tensors made from host vectors, released when the Buffers goes out of scope.
class Buffers {
 public:
  explicit Buffers(Ops& ops) : ops_(ops) {}
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    for (auto& t : owned_) ops_.release(t);
  }

  Tensor zeros(size_t n, DType dtype = DType::f32) {
    owned_.push_back(ops_.alloc(n, dtype));
    return owned_.back();
  }
  Tensor f32(const std::vector<float>& host) {
    Tensor t = zeros(host.size());
    ops_.upload(t, host.data(), DType::f32, host.size());
    return t;
  }
  Tensor i32(const std::vector<int32_t>& host) {
    Tensor t = zeros(host.size(), DType::i32);
    ops_.upload(t, host.data(), DType::i32, host.size());
    return t;
  }
  std::vector<float> read(Tensor t) {
    std::vector<float> host(t.numel);
    ops_.download(host.data(), DType::f32, t, t.numel);
    return host;
  }

 private:
  Ops& ops_;
  std::vector<Tensor> owned_;
};

// d f / d x by central differences, all in double: the truncation error is O(h^2) and the
// rounding error ~1e-16/h, both far below the float errors being tested.
inline std::vector<double> numeric_grad(const std::function<double(const std::vector<double>&)>& f,
                                        std::vector<double> x, double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    double saved = x[i];
    x[i] = saved + h;
    double up = f(x);
    x[i] = saved - h;
    double down = f(x);
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// sum_i a[i] * r[i]: the scalar loss whose gradient w.r.t. a is r (r plays the upstream gradient).
inline double dot(const std::vector<double>& a, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * r[i];
  return s;
}

// Every |got - want| <= atol + rtol * |want|; on failure reports the worst element.
template <class A, class B>
void require_close(const std::vector<A>& got, const std::vector<B>& want, double atol, double rtol,
                   const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); i++) {
    double err = std::fabs(double(got[i]) - double(want[i]));
    double excess = err - (atol + rtol * std::fabs(double(want[i])));
    if (!(excess <= 0) && (std::isnan(excess) || excess > worst_excess)) {
      worst = i;
      worst_excess = std::isnan(excess) ? INFINITY : excess;
    }
  }
  INFO(what << ": worst element " << worst << " of " << got.size() << ": got " << (got.empty() ? 0.0 : double(got[worst]))
            << ", want " << (want.empty() ? 0.0 : double(want[worst])) << " (atol " << atol << ", rtol " << rtol << ")");
  CHECK(worst_excess < 0);
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs f with the OpenMP thread count set to n, restoring the previous count afterwards.
template <class F>
auto with_threads(int n, F f) {
  int saved = omp_get_max_threads();
  omp_set_num_threads(n);
  auto result = f();
  omp_set_num_threads(saved);
  return result;
}

// Runs `backward` once with `grads` zeroed and returns what they then hold.
inline std::vector<std::vector<float>> backward_from_zero(Ops& ops, Buffers& bufs, const std::vector<Tensor>& grads,
                                                          const std::function<void()>& backward) {
  for (Tensor g : grads) ops.zero(g);
  backward();
  std::vector<std::vector<float>> result;
  for (Tensor g : grads) result.push_back(bufs.read(g));
  return result;
}

// Checks that `backward` accumulates into each of `grads`: run from zeroed buffers once and
// then once more, the second result must be twice the first (rtol 1e-6: a sum of two equal
// floats is exact, the slack covers ops that add per-contribution, like a scatter-add).
inline void check_accumulates(Ops& ops, Buffers& bufs, const std::vector<Tensor>& grads,
                              const std::function<void()>& backward) {
  const std::vector<std::vector<float>> once = backward_from_zero(ops, bufs, grads, backward);
  backward();
  for (size_t i = 0; i < grads.size(); i++) {
    std::vector<double> twice(once[i].begin(), once[i].end());
    for (double& x : twice) x *= 2;
    require_close(bufs.read(grads[i]), twice, 0.0, 1e-6, "gradient " + std::to_string(i) + " after two calls");
  }
}

// Checks that `backward` overwrites each of `grads` (matmul_backward's and gelu_backward's dinp):
// the result from buffers holding NaN must equal, bit for bit, the result from zeroed buffers.
inline void check_overwrites(Ops& ops, Buffers& bufs, const std::vector<Tensor>& grads,
                             const std::function<void()>& backward) {
  const std::vector<std::vector<float>> from_zero = backward_from_zero(ops, bufs, grads, backward);
  for (Tensor g : grads) {
    const std::vector<float> nan(g.numel, std::numeric_limits<float>::quiet_NaN());
    ops.upload(g, nan.data(), DType::f32, g.numel);
  }
  backward();
  for (size_t i = 0; i < grads.size(); i++) {
    INFO("gradient " << i << " must not depend on what the buffer held");
    CHECK(bitwise_equal(bufs.read(grads[i]), from_zero[i]));
  }
}

// The thread counts a determinism test compares: 1 and 2 (CI's cores) and an odd 3.
inline const std::vector<int> kThreadCounts = {1, 2, 3};

// Runs `run` (returning a list of result buffers) under each of kThreadCounts and checks
// every buffer is bitwise equal to the single-thread result.
template <class F>
void check_thread_count_independent(F run) {
  const std::vector<std::vector<float>> reference = with_threads(1, run);
  for (int threads : kThreadCounts) {
    const std::vector<std::vector<float>> got = with_threads(threads, run);
    REQUIRE(got.size() == reference.size());
    for (size_t i = 0; i < got.size(); i++) {
      INFO("threads " << threads << ", result " << i);
      CHECK(bitwise_equal(got[i], reference[i]));
    }
  }
}

}  // namespace pt::test
