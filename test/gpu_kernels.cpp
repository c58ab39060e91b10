// The CUDA kernels (cuda/gelu.cu, cuda/layernorm.cu) against the CPU reference CpuOps, on random
// data of awkward sizes: n odd (the last 16-byte chunk is partial), C = 771 (rows not 16-byte
// aligned: the scalar path) next to C = 768 (the 128-bit path), and views one element into a
// buffer (misaligned pointers: the scalar path). Outputs are poisoned with NaN (0xFF bytes)
// before each launch, so an element a kernel forgets to write fails the test.
//
// Tolerance: relative L2 error ||gpu - ref|| / ||ref|| <= 1e-5 for fp32 and <= 1e-2 for bf16
// (bf16 outputs carry one rounding, ~2^-9 relative). bf16 inputs are rounded on the host first
// and the reference is computed on those rounded values, so the tolerance only covers the
// kernel's own arithmetic and output rounding. LayerNorm statistics are fp32 in both cases and
// are held to 1e-5.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_memory.h"
#include "cuda/gelu.h"
#include "cuda/layernorm.h"
#include "relative_error.h"

namespace {

using pt::DType;
using pt::test::count_nonfinite;
using pt::test::relative_l2;

// ---- host bf16 (round to nearest even, as the kernels' __float2bfloat16_rn) ------------------
uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays NaN (rounding could make it inf)
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_value(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<float> rounded(DType dtype, std::vector<float> v) {
  if (dtype == DType::bf16)
    for (float& x : v) x = bf16_value(bf16_bits(x));
  return v;
}

// ---- device buffers ----------------------------------------------------------------------
// n elements of dtype on the device, starting `offset` elements into the allocation (offset 1
// makes the pointer misaligned for 128-bit accesses). Uploads and downloads convert from/to f32.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t n, DType dtype, size_t offset = 0) : n_(n), dtype_(dtype), offset_(offset) {
    base_ = pt::cuda_malloc((n + offset) * pt::dtype_size(dtype));
  }
  ~DeviceBuffer() { pt::cuda_free(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return static_cast<char*>(base_) + offset_ * pt::dtype_size(dtype_); }
  float* f32() const { return static_cast<float*>(data()); }
  size_t bytes() const { return n_ * pt::dtype_size(dtype_); }

  void upload(const std::vector<float>& host) {
    REQUIRE(host.size() == n_);
    if (dtype_ == DType::f32) {
      pt::cuda_memcpy_h2d(data(), host.data(), bytes());
    } else {
      std::vector<uint16_t> bits(n_);
      for (size_t i = 0; i < n_; ++i) bits[i] = bf16_bits(host[i]);
      pt::cuda_memcpy_h2d(data(), bits.data(), bytes());
    }
  }

  std::vector<float> download() const {
    std::vector<float> host(n_);
    if (dtype_ == DType::f32) {
      pt::cuda_memcpy_d2h(host.data(), data(), bytes());
    } else {
      std::vector<uint16_t> bits(n_);
      pt::cuda_memcpy_d2h(bits.data(), data(), bytes());
      for (size_t i = 0; i < n_; ++i) host[i] = bf16_value(bits[i]);
    }
    return host;
  }

  // 0xFF bytes are a NaN in f32 and in bf16.
  void poison() { pt::cuda_memset(data(), 0xFF, bytes()); }

 private:
  void* base_ = nullptr;
  size_t n_;
  DType dtype_;
  size_t offset_;
};

// ---- the CPU reference -------------------------------------------------------------------
pt::CpuOps& cpu() {
  static pt::CpuOps ops;
  return ops;
}

// A CpuOps f32 tensor, released when it goes out of scope.
struct CpuTensor {
  pt::Tensor t;
  explicit CpuTensor(size_t n) : t(cpu().alloc(n, DType::f32)) {}
  explicit CpuTensor(const std::vector<float>& v) : CpuTensor(v.size()) {
    cpu().upload(t, v.data(), DType::f32, v.size());
  }
  ~CpuTensor() { cpu().release(t); }
  CpuTensor(const CpuTensor&) = delete;
  CpuTensor& operator=(const CpuTensor&) = delete;
  std::vector<float> values() const {
    std::vector<float> v(t.numel);
    cpu().download(v.data(), DType::f32, t, t.numel);
    return v;
  }
};

// ---- data and comparison -------------------------------------------------------------------
std::vector<float> random_normal(size_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Rows with their own offset and spread, as the residual stream has: exercises the two-pass
// variance and makes mean/rstd vary from row to row.
std::vector<float> random_rows(int N, int C, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> shift(-2.0f, 2.0f), spread(0.5f, 2.0f);
  std::vector<float> v(static_cast<size_t>(N) * C);
  for (int r = 0; r < N; ++r) {
    float mu = shift(rng), sigma = spread(rng);
    for (int c = 0; c < C; ++c) v[static_cast<size_t>(r) * C + c] = mu + sigma * normal(rng);
  }
  return v;
}

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-2; }
constexpr double kStatsTolerance = 1e-5;

// Checks one output against its reference with a message naming it.
void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& ref, double tol) {
  size_t bad = count_nonfinite(got);
  double err = relative_l2(got, ref);
  INFO(what << ": " << bad << " non-finite elements, relative L2 error " << err << " (tolerance " << tol << ")");
  CHECK(bad == 0);
  CHECK(err <= tol);
}

}  // namespace

TEST_CASE("the CUDA runtime reports a device", "[gpu]") {
  REQUIRE(pt::cuda_device_count() > 0);
  std::string status = pt::cuda_status_message();
  INFO(status);
  CHECK(!status.empty());
}

TEST_CASE("gelu_forward matches CpuOps", "[gpu][gelu]") {
  for (size_t n : {size_t{1000003}, size_t{5}}) {  // 5: one partial chunk and nothing else
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (size_t offset : {0, 1}) {  // 1: misaligned pointers, the scalar path
        INFO("n " << n << ", dtype " << pt::dtype_name(dtype) << ", offset " << offset);
        // stddev 3: both tails, where tanh saturates, and the curved middle
        std::vector<float> x = rounded(dtype, random_normal(n, 3.0f, 1));
        CpuTensor cin(x), cout(n);
        cpu().gelu_forward(cout.t, cin.t, n);
        std::vector<float> ref = cout.values();

        DeviceBuffer in(n, dtype, offset), out(n, dtype, offset);
        in.upload(x);
        out.poison();
        pt::gpu::gelu_forward(dtype, out.data(), in.data(), n);
        pt::cuda_synchronize();
        expect_close("out", out.download(), ref, tolerance(dtype));

        // in place (out aliases inp), as the header allows
        pt::gpu::gelu_forward(dtype, in.data(), in.data(), n);
        pt::cuda_synchronize();
        expect_close("in-place out", in.download(), ref, tolerance(dtype));
      }
    }
  }
}

TEST_CASE("gelu_backward overwrites dinp like CpuOps", "[gpu][gelu]") {
  for (size_t n : {size_t{1000003}, size_t{5}}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (size_t offset : {0, 1}) {
        INFO("n " << n << ", dtype " << pt::dtype_name(dtype) << ", offset " << offset);
        std::vector<float> x = rounded(dtype, random_normal(n, 3.0f, 2));
        std::vector<float> dout = rounded(dtype, random_normal(n, 1.0f, 3));
        // dinp is an output (Ops::gelu_backward overwrites it): poisoned, so an element left
        // unwritten, or one the kernel adds to, fails.
        CpuTensor cx(x), cdout(dout), cdinp(std::vector<float>(n, 0.0f));
        cpu().gelu_backward(cdinp.t, cx.t, cdout.t, n);
        std::vector<float> ref = cdinp.values();

        DeviceBuffer dx(n, dtype, offset), ddout(n, dtype, offset), ddinp(n, dtype, offset);
        dx.upload(x);
        ddout.upload(dout);
        ddinp.poison();
        pt::gpu::gelu_backward(dtype, ddinp.data(), dx.data(), ddout.data(), n);
        pt::cuda_synchronize();
        expect_close("dinp", ddinp.download(), ref, tolerance(dtype));
      }
    }
  }
}

TEST_CASE("layernorm_forward matches CpuOps", "[gpu][layernorm]") {
  const int N = 37;
  for (int C : {771, 768}) {  // 771: scalar path; 768 (GPT-2 124M): 128-bit path when aligned
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (size_t offset : {0, 1}) {
        INFO("N " << N << ", C " << C << ", dtype " << pt::dtype_name(dtype) << ", offset " << offset);
        const size_t NC = static_cast<size_t>(N) * C;
        std::vector<float> x = rounded(dtype, random_rows(N, C, 5));
        std::vector<float> w = rounded(dtype, random_normal(C, 1.0f, 6));
        std::vector<float> b = rounded(dtype, random_normal(C, 0.5f, 7));
        CpuTensor cx(x), cw(w), cb(b), cout(NC), cmean(N), crstd(N);
        cpu().layernorm_forward(cout.t, cmean.t, crstd.t, cx.t, cw.t, cb.t, N, C);

        DeviceBuffer dx(NC, dtype, offset), dw(C, dtype, offset), db(C, dtype, offset), dout(NC, dtype, offset);
        DeviceBuffer dmean(N, DType::f32), drstd(N, DType::f32);
        dx.upload(x);
        dw.upload(w);
        db.upload(b);
        dout.poison();
        dmean.poison();
        drstd.poison();
        pt::gpu::layernorm_forward(dtype, dout.data(), dmean.f32(), drstd.f32(), dx.data(), dw.data(), db.data(), N,
                                   C);
        pt::cuda_synchronize();
        expect_close("out", dout.download(), cout.values(), tolerance(dtype));
        expect_close("mean", dmean.download(), cmean.values(), kStatsTolerance);
        expect_close("rstd", drstd.download(), crstd.values(), kStatsTolerance);

        // Statistics are optional (inference, recompute): null mean/rstd still gives the output.
        dout.poison();
        pt::gpu::layernorm_forward(dtype, dout.data(), nullptr, nullptr, dx.data(), dw.data(), db.data(), N, C);
        pt::cuda_synchronize();
        expect_close("out without statistics", dout.download(), cout.values(), tolerance(dtype));
      }
    }
  }
}

TEST_CASE("fused_residual_layernorm_forward matches CpuOps add + layernorm", "[gpu][layernorm]") {
  const int N = 37;
  for (int C : {771, 768}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (size_t offset : {0, 1}) {
        INFO("N " << N << ", C " << C << ", dtype " << pt::dtype_name(dtype) << ", offset " << offset);
        const size_t NC = static_cast<size_t>(N) * C;
        std::vector<float> a = rounded(dtype, random_rows(N, C, 8));
        std::vector<float> b = rounded(dtype, random_normal(NC, 0.5f, 9));
        std::vector<float> w = rounded(dtype, random_normal(C, 1.0f, 10));
        std::vector<float> bias = rounded(dtype, random_normal(C, 0.5f, 11));

        // Reference: the residual as the GPU stores it (fp32 sum, rounded to the dtype), then
        // CpuOps' LayerNorm of exactly that residual.
        CpuTensor ca(a), cb(b), csum(NC);
        cpu().add(csum.t, ca.t, cb.t, NC);
        std::vector<float> residual = rounded(dtype, csum.values());
        CpuTensor cres(residual), cw(w), cbias(bias), cout(NC), cmean(N), crstd(N);
        cpu().layernorm_forward(cout.t, cmean.t, crstd.t, cres.t, cw.t, cbias.t, N, C);

        DeviceBuffer da(NC, dtype, offset), db(NC, dtype, offset), dw(C, dtype, offset), dbias(C, dtype, offset);
        DeviceBuffer dres(NC, dtype, offset), dout(NC, dtype, offset), dmean(N, DType::f32), drstd(N, DType::f32);
        da.upload(a);
        db.upload(b);
        dw.upload(w);
        dbias.upload(bias);
        dres.poison();
        dout.poison();
        dmean.poison();
        drstd.poison();
        pt::gpu::fused_residual_layernorm_forward(dtype, dres.data(), dout.data(), dmean.f32(), drstd.f32(),
                                                  da.data(), db.data(), dw.data(), dbias.data(), N, C);
        pt::cuda_synchronize();
        expect_close("residual", dres.download(), residual, tolerance(dtype));
        expect_close("out", dout.download(), cout.values(), tolerance(dtype));
        expect_close("mean", dmean.download(), cmean.values(), kStatsTolerance);
        expect_close("rstd", drstd.download(), crstd.values(), kStatsTolerance);
      }
    }
  }
}

TEST_CASE("kernel launchers reject what they cannot run", "[gpu]") {
  DeviceBuffer x(16, DType::f32);
  CHECK_THROWS_AS(pt::gpu::gelu_forward(DType::i32, x.data(), x.data(), 16), pt::RuntimeError);
  CHECK_THROWS_AS(pt::gpu::layernorm_forward(DType::f32, x.data(), nullptr, nullptr, x.data(), x.data(), x.data(),
                                             1, 0),
                  pt::RuntimeError);
  CHECK_THROWS_AS(pt::gpu::layernorm_forward(DType::f32, x.data(), nullptr, nullptr, nullptr, x.data(), x.data(),
                                             1, 16),
                  pt::RuntimeError);
  // n == 0 / N == 0 launch nothing (a zero-block grid would be a CUDA error).
  CHECK_NOTHROW(pt::gpu::gelu_forward(DType::f32, x.data(), x.data(), 0));
  CHECK_NOTHROW(pt::gpu::layernorm_forward(DType::f32, x.data(), nullptr, nullptr, x.data(), x.data(), x.data(), 0,
                                           16));
  CHECK_NOTHROW(pt::cuda_synchronize());
}
