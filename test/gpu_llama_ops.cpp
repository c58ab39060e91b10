// CudaOps RMSNorm, RoPE and SwiGLU (the Llama ops) against CpuOps, in fp32 and bf16 mode on
// fresh random inputs: widths that take the 128-bit paths (768, HS = 64) next to ones that take
// the scalar paths (771, HS = 6), and slices one element into their buffers. Outputs are poisoned
// (NaN) before each forward and before swiglu_backward (which overwrites), so an element a kernel
// forgets to write fails; rmsnorm_backward runs from zero and from nonzero gradients ("+="), and
// with bf16 weight gradients. Every op also runs on slices one element in (the scalar paths),
// and SwiGLU on 16.8 M elements, more than one capped grid holds (the grid-stride loop's second
// lap).
// RoPE runs on grouped-query rows at positions up to 131071 (angles of 10^5 radians, where a
// low-precision sin/cos would be far off), and v must come back bit for bit.
// Tolerances (relative L2, gpu_test_support.h): 1e-5 in fp32; in bf16 1e-2 for bf16 outputs and
// 1e-4 for fp32 ones (rstd, the fp32 weight gradient).
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::gputest;

namespace {

const DType kModes[] = {DType::f32, DType::bf16};

// Rows with their own scale, like the residual stream; some large, some small.
std::vector<float> residual_like(int N, int C, uint32_t seed) {
  std::vector<float> x = random_normal(size_t(N) * C, 1.0f, seed);
  const std::vector<float> scale = random_normal(N, 2.0f, seed + 1);
  for (int r = 0; r < N; ++r)
    for (int k = 0; k < C; ++k) x[size_t(r) * C + k] *= 0.1f + std::fabs(scale[r]);
  return x;
}

}  // namespace

TEST_CASE("rmsnorm_forward and rmsnorm_backward match CpuOps", "[gpu][llama][rmsnorm]") {
  const int N = 37;
  const float eps = 1e-5f;
  for (int C : {771, 768}) {
    for (DType mode : kModes) {
      INFO("C " << C << ", mode " << mode_name(mode));
      Ops& ops = gpu(mode);
      Tensors g(ops), c(cpu());
      const size_t NC = size_t(N) * C;
      const std::vector<float> x = rounded(mode, residual_like(N, C, 201));
      const std::vector<float> w = rounded(mode, random_normal(C, 1.0f, 203));
      Tensor cx = c.make(x, DType::f32), cw = c.make(w, DType::f32);
      Tensor cout = c.zeros(NC, DType::f32), crstd = c.zeros(N, DType::f32);
      cpu().rmsnorm_forward(cout, crstd, cx, cw, N, C, eps);

      Tensor gx = g.make(x, mode), gw = g.make(w, mode);
      Tensor gout = g.zeros(NC, mode), grstd = g.zeros(N, DType::f32);
      g.poison(gout);
      g.poison(grstd);
      ops.rmsnorm_forward(gout, grstd, gx, gw, N, C, eps);
      const std::vector<float> out1 = g.read(gout);
      expect_close("out", out1, c.read(cout), tolerance(mode, mode));
      expect_close("rstd", g.read(grstd), c.read(crstd), tolerance(mode, DType::f32));
      Tensor gout_eval = g.zeros(NC, mode);
      g.poison(gout_eval);
      ops.rmsnorm_forward(gout_eval, Tensor{}, gx, gw, N, C, eps);  // rstd null (evaluation)
      CHECK(bitwise_equal(g.read(gout_eval), out1));

      // Backward from the reference rstd, so only the backward is measured.
      Tensor gr = g.make(c.read(crstd), DType::f32);
      const std::vector<float> dout = rounded(mode, random_normal(NC, 1.0f, 204));
      Tensor cdout = c.make(dout, DType::f32), gdout = g.make(dout, mode);
      double scale_dx = 1, scale_dw = 1;
      for (bool accumulate : {false, true}) {
        INFO("accumulate " << accumulate);
        // Start values with the gradient's own rms, so neither part of the sum hides the other.
        const std::vector<float> dx0 =
            accumulate ? rounded(mode, random_normal(NC, float(scale_dx), 205)) : std::vector<float>(NC, 0.0f);
        const std::vector<float> dw0 =
            accumulate ? random_normal(C, float(scale_dw), 206) : std::vector<float>(C, 0.0f);
        Tensor cdx = c.make(dx0, DType::f32), cdw = c.make(dw0, DType::f32);
        cpu().rmsnorm_backward(cdx, cdw, cdout, cx, cw, crstd, N, C);
        Tensor gdx = g.make(dx0, mode), gdw = g.make(dw0, DType::f32);  // parameter gradients are fp32
        ops.rmsnorm_backward(gdx, gdw, gdout, gx, gw, gr, N, C);
        const std::vector<float> rdx = c.read(cdx), rdw = c.read(cdw);
        expect_close("dinp", g.read(gdx), rdx, tolerance(mode, mode));
        expect_close("dw", g.read(gdw), rdw, tolerance(mode, DType::f32));
        if (!accumulate) {
          scale_dx = rms(rdx), scale_dw = rms(rdw);
          // Deterministic column sums: a second run from zero gives the same bits.
          Tensor gdw2 = g.zeros(C, DType::f32);
          ops.rmsnorm_backward(Tensor{}, gdw2, gdout, gx, Tensor{}, gr, N, C);
          CHECK(bitwise_equal(g.read(gdw2), g.read(gdw)));
        }
      }
    }
  }
}

TEST_CASE("residual_rmsnorm_forward matches CpuOps and is bitwise add + rmsnorm_forward", "[gpu][llama][rmsnorm]") {
  const int N = 37;
  const float eps = 1e-6f;
  // Whole allocations (the 128-bit path when C allows), a and b one element into theirs (CudaOps
  // then runs add + rmsnorm_forward so the norm keeps its 128-bit path), everything one element
  // in (the scalar path of the fused kernel).
  struct Layout {
    const char* name;
    size_t ab, rest;
  };
  const Layout layouts[] = {{"aligned", 0, 0}, {"a, b misaligned", 1, 0}, {"all misaligned", 1, 1}};
  for (int C : {771, 768}) {
    for (DType mode : kModes) {
      for (const Layout& lay : layouts) {
        INFO("C " << C << ", mode " << mode_name(mode) << ", " << lay.name);
        Ops& ops = gpu(mode);
        Tensors g(ops), c(cpu());
        const size_t NC = size_t(N) * C;
        const std::vector<float> a = rounded(mode, residual_like(N, C, 211));
        const std::vector<float> b = rounded(mode, random_normal(NC, 0.5f, 213));
        const std::vector<float> w = rounded(mode, random_normal(C, 1.0f, 214));

        // Reference: the residual as the backend stores it, then CpuOps' RMSNorm of exactly that.
        Tensor csum = c.zeros(NC, DType::f32);
        cpu().add(csum, c.make(a, DType::f32), c.make(b, DType::f32), NC);
        const std::vector<float> residual = rounded(mode, c.read(csum));
        Tensor cout = c.zeros(NC, DType::f32), crstd = c.zeros(N, DType::f32);
        cpu().rmsnorm_forward(cout, crstd, c.make(residual, DType::f32), c.make(w, DType::f32), N, C, eps);

        auto poisoned = [&](size_t n, DType dt, size_t offset) {
          Tensor whole = g.zeros(n + offset, dt);
          g.poison(whole);
          return whole.slice(offset, n);
        };
        Tensor ga = g.make_at(a, mode, lay.ab), gb = g.make_at(b, mode, lay.ab), gw = g.make_at(w, mode, lay.rest);
        Tensor gres = poisoned(NC, mode, lay.rest), gout = poisoned(NC, mode, lay.rest);
        Tensor grstd = poisoned(N, DType::f32, 0);
        ops.residual_rmsnorm_forward(gres, gout, grstd, ga, gb, gw, N, C, eps);
        const std::vector<float> res1 = g.read(gres), out1 = g.read(gout), rstd1 = g.read(grstd);
        expect_close("residual", res1, residual, tolerance(mode, mode));
        expect_close("out", out1, c.read(cout), tolerance(mode, mode));
        expect_close("rstd", rstd1, c.read(crstd), tolerance(mode, DType::f32));

        // Bitwise the two ops it fuses, on this backend (recompute rebuilds out with rmsnorm_forward).
        Tensor gres2 = poisoned(NC, mode, lay.rest), gout2 = poisoned(NC, mode, lay.rest);
        Tensor grstd2 = poisoned(N, DType::f32, 0);
        ops.add(gres2, ga, gb, NC);
        ops.rmsnorm_forward(gout2, grstd2, gres2, gw, N, C, eps);
        CHECK(bitwise_equal(res1, g.read(gres2)));
        CHECK(bitwise_equal(out1, g.read(gout2)));
        CHECK(bitwise_equal(rstd1, g.read(grstd2)));

        // residual aliases a (the in-place stream), rstd null (evaluation); held to rmsnorm_forward
        // on the residual where it now sits.
        Tensor gout3 = poisoned(NC, mode, lay.rest), gout4 = poisoned(NC, mode, lay.rest);
        ops.residual_rmsnorm_forward(ga, gout3, Tensor{}, ga, gb, gw, N, C, eps);
        CHECK(bitwise_equal(g.read(ga), res1));
        const std::vector<float> out3 = g.read(gout3);
        expect_close("out, residual in place", out3, c.read(cout), tolerance(mode, mode));
        ops.rmsnorm_forward(gout4, Tensor{}, ga, gw, N, C, eps);
        CHECK(bitwise_equal(out3, g.read(gout4)));
      }
    }
  }
  Ops& ops = gpu(DType::f32);
  Tensors g(ops);
  Tensor x = g.zeros(64, DType::f32), w = g.zeros(8, DType::f32);
  CHECK_THROWS_AS(ops.residual_rmsnorm_forward(x, x, Tensor{}, x, x, w, 8, 8, 1e-5f), RuntimeError);
}

TEST_CASE("rope_forward and rope_backward match CpuOps on grouped-query rows", "[gpu][llama][rope]") {
  struct Shape {
    int HS, n_heads, n_kv;
  };
  // HS = 64: the 128-bit path in fp32 and bf16; HS = 6: the scalar path (HS/2 = 3).
  for (Shape s : {Shape{64, 4, 2}, Shape{6, 3, 1}}) {
    const int B = 2, T = 37;
    const int row_width = (s.n_heads + 2 * s.n_kv) * s.HS, rot_heads = s.n_heads + s.n_kv;
    // Global positions, not 0..T-1 and not sorted (context parallelism), up to 2^17 - 1.
    std::vector<int32_t> pos = random_ints(T, 0, 8192, 221);
    pos[0] = 131071;
    pos[5] = 65535;
    pos[9] = 0;
    for (float theta : {10000.0f, 500000.0f}) {
      for (DType mode : kModes) {
        INFO("HS " << s.HS << ", theta " << theta << ", mode " << mode_name(mode));
        Ops& ops = gpu(mode);
        Tensors g(ops), c(cpu());
        const size_t n = size_t(B) * T * row_width;
        const std::vector<float> x = rounded(mode, random_normal(n, 1.0f, 222));
        Tensor cpos = c.ints(pos), gpos = g.ints(pos);

        Tensor cx = c.make(x, DType::f32), gx = g.make(x, mode);
        cpu().rope_forward(cx, cpos, B, T, row_width, rot_heads, s.HS, theta);
        ops.rope_forward(gx, gpos, B, T, row_width, rot_heads, s.HS, theta);
        const std::vector<float> y = g.read(gx);
        expect_close("rope_forward", y, c.read(cx), tolerance(mode, mode));
        bool v_intact = true;
        for (int r = 0; r < B * T; r++)
          for (int j = rot_heads * s.HS; j < row_width; j++)
            v_intact = v_intact && y[size_t(r) * row_width + j] == x[size_t(r) * row_width + j];
        CHECK(v_intact);

        const std::vector<float> d = rounded(mode, random_normal(n, 1.0f, 223));
        Tensor cd = c.make(d, DType::f32), gd = g.make(d, mode);
        cpu().rope_backward(cd, cpos, B, T, row_width, rot_heads, s.HS, theta);
        ops.rope_backward(gd, gpos, B, T, row_width, rot_heads, s.HS, theta);
        expect_close("rope_backward", g.read(gd), c.read(cd), tolerance(mode, mode));

        // backward undoes forward (an orthogonal rotation), to the dtype's rounding.
        ops.rope_backward(gx, gpos, B, T, row_width, rot_heads, s.HS, theta);
        expect_close("rope_backward(rope_forward(x))", g.read(gx), x, tolerance(mode, mode));
      }
    }
  }
  Ops& ops = gpu(DType::f32);
  Tensors g(ops);
  Tensor x = g.zeros(64, DType::f32), p = g.ints({0, 1});
  CHECK_THROWS_AS(ops.rope_forward(x, p, 1, 2, 32, 2, 15, 10000.0f), RuntimeError);  // odd HS
  CHECK_THROWS_AS(ops.rope_forward(x, p, 1, 2, 32, 3, 16, 10000.0f), RuntimeError);  // heads past the row
}

TEST_CASE("rope on a slice one element into its buffer (the scalar path) matches CpuOps", "[gpu][llama][rope]") {
  const int B = 1, T = 5, HS = 64, row_width = 3 * HS, rot_heads = 2;
  const std::vector<int32_t> pos = {100, 4, 77, 3000, 9};
  for (DType mode : kModes) {
    INFO("mode " << mode_name(mode));
    Ops& ops = gpu(mode);
    Tensors g(ops), c(cpu());
    const size_t n = size_t(B) * T * row_width;
    const std::vector<float> x = rounded(mode, random_normal(n, 1.0f, 224));
    Tensor cx = c.make(x, DType::f32);
    cpu().rope_forward(cx, c.ints(pos), B, T, row_width, rot_heads, HS, 10000.0f);
    std::vector<float> padded(1, 0.0f);
    padded.insert(padded.end(), x.begin(), x.end());
    Tensor whole = g.make(padded, mode), gx = whole.slice(1, n);
    ops.rope_forward(gx, g.ints(pos), B, T, row_width, rot_heads, HS, 10000.0f);
    expect_close("rope_forward, misaligned", g.read(gx), c.read(cx), tolerance(mode, mode));
    CHECK(g.read(whole)[0] == 0.0f);  // nothing before the slice is touched

    // rope_backward on the same misaligned layout.
    const std::vector<float> d = rounded(mode, random_normal(n, 1.0f, 225));
    Tensor cd = c.make(d, DType::f32), gd = g.make_at(d, mode, 1);
    cpu().rope_backward(cd, c.ints(pos), B, T, row_width, rot_heads, HS, 10000.0f);
    ops.rope_backward(gd, g.ints(pos), B, T, row_width, rot_heads, HS, 10000.0f);
    expect_close("rope_backward, misaligned", g.read(gd), c.read(cd), tolerance(mode, mode));
  }
}

TEST_CASE("swiglu_forward and swiglu_backward match CpuOps", "[gpu][llama][swiglu]") {
  const int N = 37;
  for (int H : {771, 768}) {
    for (DType mode : kModes) {
      INFO("H " << H << ", mode " << mode_name(mode));
      Ops& ops = gpu(mode);
      Tensors g(ops), c(cpu());
      const size_t NH = size_t(N) * H;
      std::vector<float> gu = random_normal(2 * NH, 3.0f, 231);
      gu[0] = -200.0f;  // exp(-g) overflows: the limits, not NaN
      gu[1] = 200.0f;
      gu = rounded(mode, gu);
      Tensor cgu = c.make(gu, DType::f32), ggu = g.make(gu, mode);
      Tensor cout = c.zeros(NH, DType::f32), gout = g.zeros(NH, mode);
      cpu().swiglu_forward(cout, cgu, N, H);
      g.poison(gout);
      ops.swiglu_forward(gout, ggu, N, H);
      expect_close("swiglu_forward", g.read(gout), c.read(cout), tolerance(mode, mode));

      // Overwritten: the GPU's gradient starts NaN-filled, the CPU's from zero.
      const std::vector<float> dout = rounded(mode, random_normal(NH, 1.0f, 232));
      Tensor cd = c.zeros(2 * NH, DType::f32), gd = g.zeros(2 * NH, mode);
      cpu().swiglu_backward(cd, cgu, c.make(dout, DType::f32), N, H);
      g.poison(gd);
      ops.swiglu_backward(gd, ggu, g.make(dout, mode), N, H);
      expect_close("swiglu_backward", g.read(gd), c.read(cd), tolerance(mode, mode));
    }
  }
}

TEST_CASE("rmsnorm_backward and swiglu off the vector path, bf16 weight gradients, a grid past its cap",
          "[gpu][llama][rmsnorm][swiglu]") {
  // rmsnorm_backward with every tensor one element into its buffer (C = 768 would take the
  // 128-bit path; the offset forbids it), in both modes, dw in fp32 and, in bf16 mode, in bf16
  // (the bf16/bf16 column finish).
  const int N = 37, C = 768;
  const size_t NC = size_t(N) * C;
  for (DType mode : kModes) {
    for (DType dw_dtype : {DType::f32, DType::bf16}) {
      if (mode == DType::f32 && dw_dtype == DType::bf16) continue;  // fp32 activations take fp32 gradients
      INFO("mode " << mode_name(mode) << ", dw " << mode_name(dw_dtype));
      Ops& ops = gpu(mode);
      Tensors g(ops), c(cpu());
      const std::vector<float> x = rounded(mode, residual_like(N, C, 241));
      const std::vector<float> w = rounded(mode, random_normal(C, 1.0f, 242));
      const std::vector<float> dout = rounded(mode, random_normal(NC, 1.0f, 243));
      Tensor cx = c.make(x, DType::f32), cw = c.make(w, DType::f32), crstd = c.zeros(N, DType::f32);
      cpu().rmsnorm_forward(c.zeros(NC, DType::f32), crstd, cx, cw, N, C, 1e-5f);
      Tensor cdx = c.zeros(NC, DType::f32), cdw = c.zeros(C, DType::f32);
      cpu().rmsnorm_backward(cdx, cdw, c.make(dout, DType::f32), cx, cw, crstd, N, C);
      Tensor gdx = g.make_at(std::vector<float>(NC, 0.0f), mode, 1);
      Tensor gdw = g.make_at(std::vector<float>(C, 0.0f), dw_dtype, 1);
      ops.rmsnorm_backward(gdx, gdw, g.make_at(dout, mode, 1), g.make_at(x, mode, 1), g.make_at(w, mode, 1),
                           g.make(c.read(crstd), DType::f32), N, C);
      expect_close("dinp, misaligned", g.read(gdx), c.read(cdx), tolerance(mode, mode));
      expect_close("dw, misaligned", g.read(gdw), c.read(cdw), tolerance(mode, dw_dtype));
    }
  }
  // swiglu on slices one element in (H = 768 would take the 128-bit path).
  const int H = 768;
  const size_t NH = size_t(N) * H;
  for (DType mode : kModes) {
    INFO("swiglu misaligned, mode " << mode_name(mode));
    Ops& ops = gpu(mode);
    Tensors g(ops), c(cpu());
    const std::vector<float> gu = rounded(mode, random_normal(2 * NH, 3.0f, 244));
    const std::vector<float> dout = rounded(mode, random_normal(NH, 1.0f, 245));
    Tensor cout = c.zeros(NH, DType::f32), cd = c.zeros(2 * NH, DType::f32);
    cpu().swiglu_forward(cout, c.make(gu, DType::f32), N, H);
    cpu().swiglu_backward(cd, c.make(gu, DType::f32), c.make(dout, DType::f32), N, H);
    Tensor ggu = g.make_at(gu, mode, 1), gout = g.make_at(std::vector<float>(NH, 0.0f), mode, 1);
    Tensor gd = g.make_at(std::vector<float>(2 * NH, 0.0f), mode, 1);
    ops.swiglu_forward(gout, ggu, N, H);
    ops.swiglu_backward(gd, ggu, g.make_at(dout, mode, 1), N, H);
    expect_close("swiglu_forward, misaligned", g.read(gout), c.read(cout), tolerance(mode, mode));
    expect_close("swiglu_backward, misaligned", g.read(gd), c.read(cd), tolerance(mode, mode));
  }
  // A grid-stride loop's second lap: on the scalar path (odd H) every element is a work item, and
  // 4100 x 4099 = 16.8 M of them is more than the 65535 blocks x 256 threads of one capped grid.
  {
    const int n = 4100, h = 4099;
    const size_t nh = size_t(n) * h;
    Ops& ops = gpu(DType::f32);
    Tensors g(ops), c(cpu());
    const std::vector<float> gu = random_normal(2 * nh, 2.0f, 246);
    const std::vector<float> dout = random_normal(nh, 1.0f, 247);
    Tensor cout = c.zeros(nh, DType::f32), cd = c.zeros(2 * nh, DType::f32);
    cpu().swiglu_forward(cout, c.make(gu, DType::f32), n, h);
    cpu().swiglu_backward(cd, c.make(gu, DType::f32), c.make(dout, DType::f32), n, h);
    Tensor ggu = g.make(gu, DType::f32), gout = g.zeros(nh, DType::f32), gd = g.zeros(2 * nh, DType::f32);
    g.poison(gout);
    g.poison(gd);
    ops.swiglu_forward(gout, ggu, n, h);
    ops.swiglu_backward(gd, ggu, g.make(dout, DType::f32), n, h);
    expect_close("swiglu_forward, 16.8 M elements", g.read(gout), c.read(cout), tolerance(DType::f32, DType::f32));
    expect_close("swiglu_backward, 16.8 M elements", g.read(gd), c.read(cd), tolerance(DType::f32, DType::f32));
  }
}
