// Helpers shared by the CudaOps tests (test/gpu_*.cpp): whether a GPU test binary runs, skips or
// fails (also mpi_gpu_parity's), host bf16 rounding, random data, tensors that free themselves,
// poison, and the relative-L2 comparison with a message naming the output.
//
// Tolerances (relative L2 error ||gpu - ref|| / ||ref||), the bounds issue 8 states:
//  - fp32 mode: 1e-5 for every output;
//  - bf16 mode: 1e-2 for bf16 outputs (one rounding to bf16 is ~2^-9 relative), and 1e-4 for
//    outputs kept in fp32 (statistics, lse, losses, fp32 parameter gradients): their inputs are
//    the same bf16-rounded values on both sides and the math is fp32, so only the summation
//    order differs.
// bf16 inputs are rounded on the host first and the CPU reference runs on those rounded
// values, so a tolerance covers only the kernel's own arithmetic and output rounding.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_memory.h"
#include "relative_error.h"

namespace pt::gputest {

using pt::test::count_nonfinite;
using pt::test::relative_l2;

// ---- run, skip or fail ------------------------------------------------------------------------
// Returns when a GPU is usable. Otherwise ends the process: 77 (ctest: skipped) on a machine
// without a GPU or driver, 1 when CUDA is there but fails (cuda_presence), so that a broken GPU
// machine fails its GPU tests instead of reporting them skipped. `tests` names what would run.
inline void exit_unless_gpu(const char* tests) {
  const CudaPresence gpu = cuda_presence();
  if (gpu.state == CudaPresence::State::present) return;
  const bool absent = gpu.state == CudaPresence::State::absent;
  std::fprintf(absent ? stdout : stderr, absent ? "no GPU (%s): skipping %s\n" : "CUDA is broken (%s): %s FAILED\n",
               gpu.detail.c_str(), tests);
  std::fflush(absent ? stdout : stderr);
  std::exit(absent ? 77 : 1);
}

// ---- host bf16, round to nearest even (the kernels' __float2bfloat16_rn) --------------------
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_value(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float round_to(DType dtype, float x) { return dtype == DType::bf16 ? bf16_value(bf16_bits(x)) : x; }

inline std::vector<float> rounded(DType dtype, std::vector<float> v) {
  for (float& x : v) x = round_to(dtype, x);
  return v;
}

// ---- random data ----------------------------------------------------------------------------
inline std::vector<float> random_normal(size_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<int32_t> random_ints(size_t n, int lo, int hi, uint32_t seed) {  // [lo, hi)
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return v.empty() ? 0.0 : std::sqrt(s / v.size());
}

// ---- comparison ---------------------------------------------------------------------------------
// The bound for an output stored in `out_dtype` by a backend running in `mode` (see the header).
inline double tolerance(DType mode, DType out_dtype) {
  if (mode == DType::f32) return 1e-5;
  return out_dtype == DType::bf16 ? 1e-2 : 1e-4;
}

inline void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& ref,
                         double tol) {
  const size_t bad = count_nonfinite(got);
  const double err = relative_l2(got, ref);
  INFO(what << ": " << bad << " non-finite elements, relative L2 error " << err << " (tolerance " << tol << ")");
  CHECK(bad == 0);
  CHECK(err <= tol);
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- backends ---------------------------------------------------------------------------------
inline CpuOps& cpu() {
  static CpuOps ops;
  return ops;
}

// One CudaOps per compute dtype for the whole test binary (a cuBLASLt handle each).
inline Ops& gpu(DType compute) {
  static std::unique_ptr<Ops> f32, bf16;
  std::unique_ptr<Ops>& slot = compute == DType::f32 ? f32 : bf16;
  if (!slot) slot = make_cuda_ops(compute);
  return *slot;
}

// Tensors of one backend, released when this goes out of scope. Values travel as f32 on the
// host; uploads to bf16 tensors round (nearest even), downloads from them are exact.
class Tensors {
 public:
  explicit Tensors(Ops& ops) : ops_(ops) {}
  Tensors(const Tensors&) = delete;
  Tensors& operator=(const Tensors&) = delete;
  ~Tensors() {
    for (auto& t : owned_) ops_.release(t);
  }

  Tensor zeros(size_t n, DType dtype) {
    owned_.push_back(ops_.alloc(n, dtype));
    return owned_.back();
  }
  Tensor make(const std::vector<float>& host, DType dtype) {
    Tensor t = zeros(host.size(), dtype);
    ops_.upload(t, host.data(), DType::f32, host.size());
    return t;
  }
  // `host` placed `offset` elements into a zeroed buffer of its own: with offset 1, a slice no
  // 16-byte (vector) path may take.
  Tensor make_at(const std::vector<float>& host, DType dtype, size_t offset) {
    Tensor t = zeros(host.size() + offset, dtype).slice(offset, host.size());
    ops_.upload(t, host.data(), DType::f32, host.size());
    return t;
  }
  Tensor ints(const std::vector<int32_t>& host) {
    Tensor t = zeros(host.size(), DType::i32);
    ops_.upload(t, host.data(), DType::i32, host.size());
    return t;
  }
  std::vector<float> read(Tensor t) {
    std::vector<float> host(t.numel);
    ops_.download(host.data(), DType::f32, t, t.numel);
    return host;
  }
  // 0xFF bytes are a NaN in f32 and bf16: an element a kernel forgets to write stays NaN.
  void poison(Tensor t) {
    ops_.synchronize();
    if (ops_.device() == Device::cuda)
      cuda_memset(t.data, 0xFF, t.bytes());
    else
      std::memset(t.data, 0xFF, t.bytes());
  }

 private:
  Ops& ops_;
  std::vector<Tensor> owned_;
};

inline const char* mode_name(DType d) { return d == DType::f32 ? "fp32" : "bf16"; }

}  // namespace pt::gputest
