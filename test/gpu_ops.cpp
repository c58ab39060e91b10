// CudaOps against CpuOps, op by op (attention is in gpu_attention.cpp), in fp32 and bf16 mode on
// fresh random inputs of awkward sizes: N = 37 rows, C = 771 channels (rows not 16-byte aligned:
// the scalar paths) next to C = 768 (the 128-bit paths). Outputs are poisoned (NaN) before each
// forward, so an element a kernel forgets to write fails; every backward runs twice, from zero
// gradients and from nonzero ones (of the reference gradient's size), so "+=" is checked too
// (and that matmul_backward's and gelu_backward's dinp are overwritten, as CpuOps's are).
// Deterministic kernels are run twice more and compared bitwise. Tolerances: gpu_test_support.h.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::gputest;

namespace {

const DType kModes[] = {DType::f32, DType::bf16};

// The starting value of a gradient buffer: zeros, or (accumulate) random values with the rms of
// the gradient itself, so neither part of the sum hides the other.
std::vector<float> start_values(bool accumulate, size_t n, double scale, DType dtype, uint32_t seed) {
  if (!accumulate) return std::vector<float>(n, 0.0f);
  return rounded(dtype, random_normal(n, static_cast<float>(scale > 0 ? scale : 1.0), seed));
}

}  // namespace

TEST_CASE("CudaOps describes itself and computes in the dtype it was made for", "[gpu][ops]") {
  for (DType mode : kModes) {
    Ops& ops = gpu(mode);
    CHECK(ops.device() == Device::cuda);
    CHECK(ops.compute_dtype() == mode);
    INFO(ops.device_description());
    CHECK(!ops.device_description().empty());
  }
  CHECK_THROWS_AS(make_cuda_ops(DType::i32), ConfigError);
  // The factory: bf16 by default on CUDA (precision.compute_dtype=auto), fp32 on request; the CPU is fp32 only.
  CHECK(make_ops(Device::cuda)->compute_dtype() == DType::bf16);
  CHECK(make_ops(Device::cuda, DType::f32)->compute_dtype() == DType::f32);
  CHECK(make_ops(Device::cpu)->compute_dtype() == DType::f32);
  CHECK_THROWS_AS(make_ops(Device::cpu, DType::bf16), ConfigError);
}

TEST_CASE("CudaOps memory: zero-filled alloc, converting upload/download/copy, zero", "[gpu][ops][memory]") {
  const size_t n = 1001;
  for (DType dtype : kModes) {
    INFO("dtype " << dtype_name(dtype));
    Ops& ops = gpu(DType::bf16);
    Tensors t(ops);
    Tensor x = t.zeros(n, dtype);
    CHECK(t.read(x) == std::vector<float>(n, 0.0f));

    const std::vector<float> v = random_normal(n, 3.0f, 1);
    ops.upload(x, v.data(), DType::f32, n);
    CHECK(t.read(x) == rounded(dtype, v));  // exact: one rounding on the way in, none out

    for (DType other : kModes) {
      Tensor y = t.zeros(n, other);
      ops.copy(y, x, n);
      CHECK(t.read(y) == rounded(other, rounded(dtype, v)));
    }
    // Overlapping same-dtype copy: memmove semantics.
    ops.copy(x.slice(1, n - 1), x.slice(0, n - 1), n - 1);
    std::vector<float> shifted = rounded(dtype, v);
    shifted.insert(shifted.begin(), shifted.front());
    shifted.pop_back();
    CHECK(t.read(x) == shifted);

    ops.zero(x);
    CHECK(t.read(x) == std::vector<float>(n, 0.0f));
  }
  // Converting copies over many blocks (n = 300007: 37 to 74 blocks of quads, a partial quad at
  // the end), whole and as odd slices: source and destination at offset 1 lie equally far from a
  // 4-element boundary (3 elements one by one, then the quads); destination offset 2 does not
  // (the scalar fallback). The elements around the destination slice stay zero.
  {
    const size_t big = 300007;
    const std::vector<float> v = random_normal(big, 3.0f, 3);
    for (DType from : kModes) {
      const DType to = from == DType::f32 ? DType::bf16 : DType::f32;
      Ops& ops = gpu(DType::bf16);
      Tensors t(ops);
      Tensor src = t.make(v, from);
      const std::vector<float> want = rounded(to, rounded(from, v));
      Tensor whole = t.zeros(big, to);
      ops.copy(whole, src, big);
      CHECK(t.read(whole) == want);
      for (size_t dst_offset : {size_t{1}, size_t{2}}) {
        INFO("from " << dtype_name(from) << ", destination offset " << dst_offset);
        Tensor dst = t.zeros(big + 2, to);
        ops.copy(dst.slice(dst_offset, big - 1), src.slice(1, big - 1), big - 1);
        std::vector<float> expect(big + 2, 0.0f);
        std::copy(want.begin() + 1, want.end(), expect.begin() + dst_offset);
        CHECK(t.read(dst) == expect);
      }
    }
  }
  Ops& ops = gpu(DType::f32);
  Tensors t(ops);
  const std::vector<int32_t> ids = random_ints(777, -5, 50000, 2);
  Tensor id = t.ints(ids);
  std::vector<int32_t> back(ids.size());
  ops.download(back.data(), DType::i32, id, ids.size());
  CHECK(back == ids);
  std::vector<float> f(ids.size());
  CHECK_THROWS_AS(ops.download(f.data(), DType::f32, id, ids.size()), RuntimeError);  // i32 -> f32 is not a cast we do
  ops.synchronize();
}

TEST_CASE("CudaOps time marks time the stream's work, not the host's launches", "[gpu][ops][timing]") {
  Ops& ops = gpu(DType::bf16);
  Tensors t(ops);
  const size_t n = size_t(64) << 20;  // 128 MiB of bf16 each way: about 0.1 ms at 3 TB/s
  Tensor a = t.zeros(n, DType::bf16), b = t.zeros(n, DType::bf16);
  ops.synchronize();
  for (int round = 0; round < 2; round++) {  // the second round reuses the events
    INFO("round " << round);
    ops.clear_time_marks();
    const auto t0 = std::chrono::steady_clock::now();
    const int first = ops.record_time_mark();
    for (int i = 0; i < 20; i++) ops.copy(b, a, n);
    const int mid = ops.record_time_mark();
    const int last = ops.record_time_mark();  // nothing between: about 0
    // Launches return long before the copies finish; the marks time the copies themselves.
    ops.synchronize();
    const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    CHECK(first == 0);
    CHECK(mid == 1);
    const double copies_ms = ops.ms_between_marks(first, mid);
    CHECK(copies_ms > 0.0);
    CHECK(copies_ms <= host_ms);
    // 20 x 256 MiB moved, so at least the time of 10 TB/s, above any GPU's memory (an H200
    // copies at 4.1 TB/s: it failed the 4 TB/s bound this had). Marks taken at launch instead
    // would time the host's 20 launches: some microseconds.
    CHECK(copies_ms >= 20 * 2.0 * n * 2 / 10e12 * 1e3);
    CHECK(ops.ms_between_marks(mid, last) < 0.1 * copies_ms);
  }
  CHECK_THROWS_WITH(ops.ms_between_marks(0, 7), Catch::Matchers::Contains("no such mark"));
}

TEST_CASE("CudaOps alloc reports out of memory with the knobs to turn", "[gpu][ops][memory]") {
  Ops& ops = gpu(DType::bf16);
  const size_t huge = size_t(1) << 46;  // 64 Ti elements: no GPU has that
  CHECK_THROWS_WITH(ops.alloc(huge, DType::f32), Catch::Contains("micro_batch_size") && Catch::Contains("zero_stage"));
  // The failed allocation must not poison later work.
  Tensors t(ops);
  Tensor x = t.zeros(16, DType::f32);
  CHECK(t.read(x) == std::vector<float>(16, 0.0f));
}

TEST_CASE("embedding_forward and embedding_backward match CpuOps", "[gpu][ops][embedding]") {
  struct Shape {
    int N, vocab_start, vocab_local;
    std::vector<int32_t> tokens;
  };
  // Small: 37 tokens from [0, 40) on the shard [10, 33): repeats, ids outside the shard, one table
  // row per sort bucket. Large: 4100 tokens (9 partition tiles, the last of 4) from [0, 2000) on
  // the shard [100, 1900) (512 buckets of up to 4 rows): rows hit a few times, and rows hit
  // exactly 32 times (the most one warp sums alone), 33 times (two pieces, the second of one hit)
  // and 300 times (10 pieces through the fp32 partials); the last two share a bucket. Their hits
  // are spread over all tiles.
  std::vector<Shape> shapes = {{37, 10, 23, random_ints(37, 0, 40, 3)}};
  {
    const int N = 4100;
    std::vector<int32_t> tok = random_ints(N, 0, 2000, 31);
    const int32_t heavy = 150, two_pieces = 150 + 512, one_piece = 1000;  // rows 50, 562 (bucket 50), 900
    for (int32_t& id : tok)
      if (id == heavy || id == two_pieces || id == one_piece) ++id;  // only the hits placed below
    int i = 0;  // hit i goes to token (13 * i) % N: distinct, since 13 and N are coprime
    for (auto [id, hits] : {std::pair{heavy, 300}, std::pair{two_pieces, 33}, std::pair{one_piece, 32}})
      for (int h = 0; h < hits; ++h, ++i) tok[(13 * i) % N] = id;
    shapes.push_back({N, 100, 1800, tok});
  }
  for (const Shape& s : shapes) {
    const int N = s.N, vocab_start = s.vocab_start, vocab_local = s.vocab_local;
    for (int C : {771, 768}) {
      for (DType mode : kModes) {
        INFO("N " << N << ", C " << C << ", mode " << mode_name(mode));
        Ops& ops = gpu(mode);
        Tensors g(ops), c(cpu());
        const std::vector<int32_t>& tok = s.tokens;
        const std::vector<float> wte = rounded(mode, random_normal(size_t(vocab_local) * C, 1.0f, 4));
        const size_t NC = size_t(N) * C;

        Tensor cout = c.zeros(NC, DType::f32);
        cpu().embedding_forward(cout, c.ints(tok), c.make(wte, DType::f32), N, C, vocab_start, vocab_local);
        Tensor gtok = g.ints(tok), gwte = g.make(wte, mode), gout = g.zeros(NC, mode);
        g.poison(gout);
        ops.embedding_forward(gout, gtok, gwte, N, C, vocab_start, vocab_local);
        expect_close("out", g.read(gout), c.read(cout), tolerance(mode, mode));

        const std::vector<float> dout = rounded(mode, random_normal(NC, 1.0f, 5));
        Tensor cdout = c.make(dout, DType::f32), gdout = g.make(dout, mode);
        // Gradients in fp32 (the model's layout) and, with bf16 activations, in bf16.
        for (DType grad : kModes) {
          if (mode == DType::f32 && grad == DType::bf16) continue;  // not a pair CudaOps takes
          std::vector<float> first_ref;
          for (bool accumulate : {false, true}) {
            INFO("grad " << dtype_name(grad) << ", accumulate " << accumulate);
            const std::vector<float> d0 = start_values(accumulate, size_t(vocab_local) * C,
                                                       first_ref.empty() ? 1.0 : rms(first_ref), grad, 6);
            Tensor cd = c.make(d0, DType::f32), gd = g.make(d0, grad);
            cpu().embedding_backward(cd, cdout, c.ints(tok), N, C, vocab_start, vocab_local);
            ops.embedding_backward(gd, gdout, gtok, N, C, vocab_start, vocab_local);
            const std::vector<float> ref = c.read(cd), got = g.read(gd);
            expect_close("dwte", got, ref, tolerance(mode, grad));
            if (!accumulate) first_ref = ref;
            // Deterministic: the same call from the same start gives the same bits.
            Tensor gd2 = g.make(d0, grad);
            ops.embedding_backward(gd2, gdout, gtok, N, C, vocab_start, vocab_local);
            CHECK(bitwise_equal(g.read(gd2), got));
          }
        }
      }
    }
  }
  // A shard above the 512 x 512 rows the sort handles is refused before anything runs.
  Ops& ops = gpu(DType::bf16);
  Tensors g(ops);
  const int C = 8, vocab_local = 512 * 512 + 1;
  Tensor dwte = g.zeros(size_t(vocab_local) * C, DType::f32);
  CHECK_THROWS_WITH(ops.embedding_backward(dwte, g.zeros(C, DType::bf16), g.ints({0}), 1, C, 0, vocab_local),
                    Catch::Contains("262144"));
}

TEST_CASE("position_forward and position_backward match CpuOps", "[gpu][ops][embedding]") {
  // Positions need not be 0..T-1: a context-parallel rank holds a zigzag share (rank 0 of 2 over
  // T = 40: positions 0-9 and 30-39 of 40 rows), and the backward must also sum every t that
  // shares a row (a repeat: row 3 three times). B = 3, 20 and 70 sum the batch with 1, 2 and 8
  // lanes per element (70: lanes of 9 and 8 b's); C = 771 takes the scalar path, 768 the 16-byte
  // one, and most tiles span several t.
  struct Positions {
    int rows;
    std::vector<int32_t> pos;
  };
  std::vector<int32_t> zigzag(20);
  for (int i = 0; i < 20; ++i) zigzag[i] = i < 10 ? i : 20 + i;
  const Positions cases[] = {{40, zigzag}, {20, {5, 0, 19, 3, 3, 7, 11, 2, 13, 1, 17, 3, 8}}};
  for (const Positions& p : cases) {
    const int T = static_cast<int>(p.pos.size()), rows = p.rows;
    for (int B : {3, 20, 70}) {
      for (int C : {771, 768}) {
        for (DType mode : kModes) {
          INFO("T " << T << ", B " << B << ", C " << C << ", mode " << mode_name(mode));
          Ops& ops = gpu(mode);
          Tensors g(ops), c(cpu());
          const size_t n = size_t(B) * T * C;
          const std::vector<float> wpe = rounded(mode, random_normal(size_t(rows) * C, 1.0f, 7));
          const std::vector<float> x0 = rounded(mode, random_normal(n, 1.0f, 8));
          Tensor cx = c.make(x0, DType::f32), gx = g.make(x0, mode);
          Tensor cpos = c.ints(p.pos), gpos = g.ints(p.pos);
          cpu().position_forward(cx, c.make(wpe, DType::f32), cpos, B, T, C);
          ops.position_forward(gx, g.make(wpe, mode), gpos, B, T, C);
          expect_close("out", g.read(gx), c.read(cx), tolerance(mode, mode));

          const std::vector<float> dout = rounded(mode, random_normal(n, 1.0f, 9));
          Tensor cdout = c.make(dout, DType::f32), gdout = g.make(dout, mode);
          for (DType grad : kModes) {
            if (mode == DType::f32 && grad == DType::bf16) continue;  // not a pair CudaOps takes
            for (bool accumulate : {false, true}) {
              INFO("grad " << dtype_name(grad) << ", accumulate " << accumulate);
              // A sum of B unit normals has rms sqrt(B).
              const std::vector<float> d0 = start_values(accumulate, size_t(rows) * C, std::sqrt(B), grad, 10);
              Tensor cd = c.make(d0, DType::f32), gd = g.make(d0, grad);
              cpu().position_backward(cd, cdout, cpos, B, T, C);
              ops.position_backward(gd, gdout, gpos, B, T, C);
              const std::vector<float> got = g.read(gd);
              expect_close("dwpe", got, c.read(cd), tolerance(mode, grad));
              // Deterministic: the same call from the same start gives the same bits.
              Tensor gd2 = g.make(d0, grad);
              ops.position_backward(gd2, gdout, gpos, B, T, C);
              CHECK(bitwise_equal(g.read(gd2), got));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("layernorm_forward and layernorm_backward match CpuOps", "[gpu][ops][layernorm]") {
  const int N = 37;
  for (int C : {771, 768}) {
    for (DType mode : kModes) {
      INFO("C " << C << ", mode " << mode_name(mode));
      Ops& ops = gpu(mode);
      Tensors g(ops), c(cpu());
      const size_t NC = size_t(N) * C;
      // Rows with their own offset and spread, like the residual stream.
      std::vector<float> x = random_normal(NC, 1.0f, 11);
      const std::vector<float> shift = random_normal(N, 2.0f, 12);
      for (int r = 0; r < N; ++r)
        for (int k = 0; k < C; ++k) x[size_t(r) * C + k] = x[size_t(r) * C + k] * (0.5f + 0.05f * r) + shift[r];
      x = rounded(mode, x);
      const std::vector<float> w = rounded(mode, random_normal(C, 1.0f, 13));
      const std::vector<float> b = rounded(mode, random_normal(C, 0.5f, 14));
      Tensor cx = c.make(x, DType::f32), cw = c.make(w, DType::f32), cb = c.make(b, DType::f32);
      Tensor cout = c.zeros(NC, DType::f32), cmean = c.zeros(N, DType::f32), crstd = c.zeros(N, DType::f32);
      cpu().layernorm_forward(cout, cmean, crstd, cx, cw, cb, N, C);

      Tensor gx = g.make(x, mode), gw = g.make(w, mode), gb = g.make(b, mode);
      Tensor gout = g.zeros(NC, mode), gmean = g.zeros(N, DType::f32), grstd = g.zeros(N, DType::f32);
      g.poison(gout);
      g.poison(gmean);
      g.poison(grstd);
      ops.layernorm_forward(gout, gmean, grstd, gx, gw, gb, N, C);
      expect_close("out", g.read(gout), c.read(cout), tolerance(mode, mode));
      expect_close("mean", g.read(gmean), c.read(cmean), tolerance(mode, DType::f32));
      expect_close("rstd", g.read(grstd), c.read(crstd), tolerance(mode, DType::f32));

      // Backward from the reference statistics, so only the backward is measured.
      const std::vector<float> mean = c.read(cmean), rstd = c.read(crstd);
      Tensor gm = g.make(mean, DType::f32), gr = g.make(rstd, DType::f32);
      const std::vector<float> dout = rounded(mode, random_normal(NC, 1.0f, 15));
      Tensor cdout = c.make(dout, DType::f32), gdout = g.make(dout, mode);
      double scale_dx = 1, scale_dw = 1, scale_db = 1;
      for (bool accumulate : {false, true}) {
        INFO("accumulate " << accumulate);
        const std::vector<float> dx0 = start_values(accumulate, NC, scale_dx, mode, 16);
        const std::vector<float> dw0 = start_values(accumulate, C, scale_dw, DType::f32, 17);
        const std::vector<float> db0 = start_values(accumulate, C, scale_db, DType::f32, 18);
        Tensor cdx = c.make(dx0, DType::f32), cdw = c.make(dw0, DType::f32), cdb = c.make(db0, DType::f32);
        cpu().layernorm_backward(cdx, cdw, cdb, cdout, cx, cw, cmean, crstd, N, C);
        Tensor gdx = g.make(dx0, mode), gdw = g.make(dw0, DType::f32), gdb = g.make(db0, DType::f32);
        ops.layernorm_backward(gdx, gdw, gdb, gdout, gx, gw, gm, gr, N, C);
        const std::vector<float> rdx = c.read(cdx), rdw = c.read(cdw), rdb = c.read(cdb);
        expect_close("dinp", g.read(gdx), rdx, tolerance(mode, mode));
        expect_close("dw", g.read(gdw), rdw, tolerance(mode, DType::f32));
        expect_close("db", g.read(gdb), rdb, tolerance(mode, DType::f32));
        if (!accumulate) {
          scale_dx = rms(rdx), scale_dw = rms(rdw), scale_db = rms(rdb);
          // Deterministic column sums: a second run from zero gives the same bits.
          Tensor gdw2 = g.zeros(C, DType::f32), gdb2 = g.zeros(C, DType::f32);
          ops.layernorm_backward(Tensor{}, gdw2, gdb2, gdout, gx, gw, gm, gr, N, C);
          CHECK(bitwise_equal(g.read(gdw2), g.read(gdw)));
          CHECK(bitwise_equal(g.read(gdb2), g.read(gdb)));
        }
      }
    }
  }
}

TEST_CASE("residual_layernorm_forward matches CpuOps and is bitwise add + layernorm_forward", "[gpu][ops][layernorm]") {
  const int N = 37;
  // Where the tensors start: whole allocations (the 128-bit path when C allows), a and b one
  // element into theirs (CudaOps then runs add + layernorm_forward so the LayerNorm keeps its
  // 128-bit path), and every tensor one element in (the scalar path of the fused kernel).
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
        // A residual stream with its own offset per row, and a branch output to add to it.
        std::vector<float> a = random_normal(NC, 1.0f, 41);
        const std::vector<float> shift = random_normal(N, 2.0f, 42);
        for (int r = 0; r < N; ++r)
          for (int k = 0; k < C; ++k) a[size_t(r) * C + k] += shift[r];
        a = rounded(mode, a);
        const std::vector<float> b = rounded(mode, random_normal(NC, 0.5f, 43));
        const std::vector<float> w = rounded(mode, random_normal(C, 1.0f, 44));
        const std::vector<float> bias = rounded(mode, random_normal(C, 0.5f, 45));

        // Reference: the residual as the backend stores it (rounded to the mode), then CpuOps'
        // LayerNorm of exactly that residual.
        Tensor ca = c.make(a, DType::f32), cb = c.make(b, DType::f32), csum = c.zeros(NC, DType::f32);
        cpu().add(csum, ca, cb, NC);
        const std::vector<float> residual = rounded(mode, c.read(csum));
        Tensor cres = c.make(residual, DType::f32), cw = c.make(w, DType::f32), cbias = c.make(bias, DType::f32);
        Tensor cout = c.zeros(NC, DType::f32), cmean = c.zeros(N, DType::f32), crstd = c.zeros(N, DType::f32);
        cpu().layernorm_forward(cout, cmean, crstd, cres, cw, cbias, N, C);

        auto place = [&](const std::vector<float>& v, DType dt, size_t offset) {
          Tensor t = g.zeros(v.size() + offset, dt).slice(offset, v.size());
          ops.upload(t, v.data(), DType::f32, v.size());
          return t;
        };
        auto poisoned = [&](size_t n, DType dt, size_t offset) {
          Tensor whole = g.zeros(n + offset, dt);
          g.poison(whole);
          return whole.slice(offset, n);
        };
        Tensor ga = place(a, mode, lay.ab), gb = place(b, mode, lay.ab);
        Tensor gw = place(w, mode, lay.rest), gbias = place(bias, mode, lay.rest);
        Tensor gres = poisoned(NC, mode, lay.rest), gout = poisoned(NC, mode, lay.rest);
        Tensor gmean = poisoned(N, DType::f32, 0), grstd = poisoned(N, DType::f32, 0);
        ops.residual_layernorm_forward(gres, gout, gmean, grstd, ga, gb, gw, gbias, N, C);
        const std::vector<float> res1 = g.read(gres), out1 = g.read(gout), mean1 = g.read(gmean),
                                 rstd1 = g.read(grstd);
        expect_close("residual", res1, residual, tolerance(mode, mode));
        expect_close("out", out1, c.read(cout), tolerance(mode, mode));
        expect_close("mean", mean1, c.read(cmean), tolerance(mode, DType::f32));
        expect_close("rstd", rstd1, c.read(crstd), tolerance(mode, DType::f32));

        // Bitwise the two ops it fuses, on this backend: the model's recompute rebuilds the
        // LayerNorm output with layernorm_forward from the stored residual.
        Tensor gres2 = poisoned(NC, mode, lay.rest), gout2 = poisoned(NC, mode, lay.rest);
        Tensor gmean2 = poisoned(N, DType::f32, 0), grstd2 = poisoned(N, DType::f32, 0);
        ops.add(gres2, ga, gb, NC);
        ops.layernorm_forward(gout2, gmean2, grstd2, gres2, gw, gbias, N, C);
        CHECK(bitwise_equal(res1, g.read(gres2)));
        CHECK(bitwise_equal(out1, g.read(gout2)));
        CHECK(bitwise_equal(mean1, g.read(gmean2)));
        CHECK(bitwise_equal(rstd1, g.read(grstd2)));

        // residual aliases a (the model's in-place stream), statistics null (evaluation). The
        // residual now sits where a does, so the LayerNorm is held to layernorm_forward there.
        Tensor gout3 = poisoned(NC, mode, lay.rest), gout4 = poisoned(NC, mode, lay.rest);
        ops.residual_layernorm_forward(ga, gout3, Tensor{}, Tensor{}, ga, gb, gw, gbias, N, C);
        CHECK(bitwise_equal(g.read(ga), res1));
        const std::vector<float> out3 = g.read(gout3);
        expect_close("out, residual in place", out3, c.read(cout), tolerance(mode, mode));
        ops.layernorm_forward(gout4, Tensor{}, Tensor{}, ga, gw, gbias, N, C);
        CHECK(bitwise_equal(out3, g.read(gout4)));
      }
    }
  }
  // out may not overlap the residual or the inputs.
  Ops& ops = gpu(DType::f32);
  Tensors g(ops);
  Tensor x = g.zeros(64, DType::f32), w = g.zeros(8, DType::f32);
  CHECK_THROWS_AS(ops.residual_layernorm_forward(x, x, Tensor{}, Tensor{}, x, x, w, w, 8, 8), RuntimeError);
}

TEST_CASE("matmul_forward and matmul_backward match CpuOps", "[gpu][ops][matmul]") {
  struct Shape {
    int N, IC, OC;
  };
  // Odd sizes (unaligned rows: cuBLASLt must pick an algorithm that copes) and GPT-2-like ones.
  for (Shape s : {Shape{37, 771, 133}, Shape{64, 768, 256}, Shape{5, 16, 3}}) {
    for (DType mode : kModes) {
      for (bool with_bias : {true, false}) {
        INFO("N " << s.N << " IC " << s.IC << " OC " << s.OC << ", mode " << mode_name(mode) << ", bias "
                  << with_bias);
        Ops& ops = gpu(mode);
        Tensors g(ops), c(cpu());
        const size_t NI = size_t(s.N) * s.IC, NO = size_t(s.N) * s.OC, WI = size_t(s.OC) * s.IC;
        const std::vector<float> x = rounded(mode, random_normal(NI, 1.0f, 21));
        const std::vector<float> w = rounded(mode, random_normal(WI, 0.05f, 22));
        const std::vector<float> b = rounded(mode, random_normal(s.OC, 0.5f, 23));
        Tensor cx = c.make(x, DType::f32), cw = c.make(w, DType::f32);
        Tensor cb = with_bias ? c.make(b, DType::f32) : Tensor{};
        Tensor cout = c.zeros(NO, DType::f32);
        cpu().matmul_forward(cout, cx, cw, cb, s.N, s.IC, s.OC);
        Tensor gx = g.make(x, mode), gw = g.make(w, mode), gb = with_bias ? g.make(b, mode) : Tensor{};
        Tensor gout = g.zeros(NO, mode);
        g.poison(gout);
        ops.matmul_forward(gout, gx, gw, gb, s.N, s.IC, s.OC);
        expect_close("out", g.read(gout), c.read(cout), tolerance(mode, mode));

        const std::vector<float> dout = rounded(mode, random_normal(NO, 1.0f, 24));
        Tensor cdout = c.make(dout, DType::f32), gdout = g.make(dout, mode);
        // Parameter gradients in fp32 (the model's layout) and, with bf16 inputs, in bf16. With dw,
        // dbias comes out of the dW product (cuBLASLt's BGRADB epilogue, where it has an
        // algorithm for the problem), else from the column reduction (checked alone below).
        for (DType grad : kModes) {
          if (mode == DType::f32 && grad == DType::bf16) continue;  // not a pair CudaOps takes
          double scale_dx = 1, scale_dw = 1, scale_db = 1;
          // dw and dbias accumulate; dinp is overwritten (Ops::matmul_backward), so from nonzero
          // start values the CPU's dinp is the plain product and the GPU's must be too. From
          // nonzero starts the backward runs twice: the epilogue overwrites its output, so a
          // bias gradient that did not add it to dbias (or added a stale one) fails.
          for (bool accumulate : {false, true}) {
            INFO("grad " << dtype_name(grad) << ", accumulate " << accumulate);
            const std::vector<float> dx0 = start_values(accumulate, NI, scale_dx, mode, 25);
            const std::vector<float> dw0 = start_values(accumulate, WI, scale_dw, grad, 26);
            const std::vector<float> db0 = start_values(accumulate, s.OC, scale_db, grad, 27);
            Tensor cdx = c.make(dx0, DType::f32), cdw = c.make(dw0, DType::f32), cdb = c.make(db0, DType::f32);
            Tensor gdx = g.make(dx0, mode), gdw = g.make(dw0, grad), gdb = g.make(db0, grad);
            for (int call = 0; call < (accumulate ? 2 : 1); ++call) {
              cpu().matmul_backward(cdx, cdw, with_bias ? cdb : Tensor{}, cdout, cx, cw, s.N, s.IC, s.OC);
              ops.matmul_backward(gdx, gdw, with_bias ? gdb : Tensor{}, gdout, gx, gw, s.N, s.IC, s.OC);
            }
            const std::vector<float> rdx = c.read(cdx), rdw = c.read(cdw), rdb = c.read(cdb);
            expect_close("dinp", g.read(gdx), rdx, tolerance(mode, mode));
            expect_close("dw", g.read(gdw), rdw, tolerance(mode, grad));
            if (with_bias) expect_close("dbias", g.read(gdb), rdb, tolerance(mode, grad));
            else CHECK(g.read(gdb) == db0);  // a null dbias is not written
            if (!accumulate) scale_dx = rms(rdx), scale_dw = rms(rdw), scale_db = rms(rdb);
          }
        }
        // Each gradient alone (the others null) is the same computation: dw without the
        // epilogue, dbias through the column reduction.
        Tensor gdw_only = g.zeros(WI, DType::f32), gdb_only = g.zeros(s.OC, DType::f32);
        ops.matmul_backward(Tensor{}, gdw_only, Tensor{}, gdout, gx, gw, s.N, s.IC, s.OC);
        ops.matmul_backward(Tensor{}, Tensor{}, gdb_only, gdout, Tensor{}, Tensor{}, s.N, s.IC, s.OC);
        Tensor cdw_only = c.zeros(WI, DType::f32), cdb_only = c.zeros(s.OC, DType::f32);
        cpu().matmul_backward(Tensor{}, cdw_only, cdb_only, cdout, cx, cw, s.N, s.IC, s.OC);
        expect_close("dw alone", g.read(gdw_only), c.read(cdw_only), tolerance(mode, DType::f32));
        expect_close("dbias alone", g.read(gdb_only), c.read(cdb_only), tolerance(mode, DType::f32));
      }
    }
  }
}

TEST_CASE("matmul on misaligned slices, with an unaligned bias and with fp32 output", "[gpu][ops][matmul]") {
  // Tensors are slices at arbitrary element offsets (tensor-parallel pieces, packed parameter
  // arenas): offset 1 makes every pointer 2- or 4-byte aligned only, so cuBLASLt must be asked
  // for (and find) an algorithm for that alignment, and the bias cannot go through the epilogue
  // (add_bias_rows adds it). The bias gradient's epilogue writes to aligned scratch, so a
  // misaligned dbias does not exclude it; dbias alone takes the column reduction's scalar loads
  // (with OC = 129, rows are not 16-byte aligned). fp32 output from bf16 inputs is the other
  // dtype pair the op allows.
  const int N = 37, IC = 768, OC = 129;
  for (DType mode : kModes) {
    const std::vector<DType> out_dtypes =
        mode == DType::f32 ? std::vector<DType>{DType::f32} : std::vector<DType>{DType::bf16, DType::f32};
    for (DType out_dtype : out_dtypes) {
      for (size_t off : {size_t{0}, size_t{1}}) {
        INFO("mode " << mode_name(mode) << ", out " << dtype_name(out_dtype) << ", offset " << off);
        Ops& ops = gpu(mode);
        Tensors g(ops), c(cpu());
        const size_t NI = size_t(N) * IC, NO = size_t(N) * OC, WI = size_t(OC) * IC;
        const std::vector<float> x = rounded(mode, random_normal(NI, 1.0f, 121));
        const std::vector<float> w = rounded(mode, random_normal(WI, 0.05f, 122));
        const std::vector<float> b = rounded(out_dtype, random_normal(OC, 0.5f, 123));
        auto at = [&](const std::vector<float>& v, DType dt) {  // v placed `off` elements into a buffer
          std::vector<float> padded(off, 0.0f);
          padded.insert(padded.end(), v.begin(), v.end());
          return g.make(padded, dt).slice(off, v.size());
        };
        Tensor cout = c.zeros(NO, DType::f32);
        cpu().matmul_forward(cout, c.make(x, DType::f32), c.make(w, DType::f32), c.make(b, DType::f32), N, IC, OC);
        Tensor gx = at(x, mode), gw = at(w, mode), gb = at(b, out_dtype);
        Tensor gout = g.zeros(NO + off, out_dtype).slice(off, NO);
        g.poison(gout);
        ops.matmul_forward(gout, gx, gw, gb, N, IC, OC);
        expect_close("out", g.read(gout), c.read(cout), tolerance(mode, out_dtype));

        // Backward into misaligned gradients, accumulating onto nonzero starts.
        const std::vector<float> dout = rounded(mode, random_normal(NO, 1.0f, 124));
        const std::vector<float> dx0 = rounded(mode, random_normal(NI, 0.5f, 125));
        const std::vector<float> dw0 = random_normal(WI, 5.0f, 126), db0 = random_normal(OC, 5.0f, 127);
        Tensor cdx = c.make(dx0, DType::f32), cdw = c.make(dw0, DType::f32), cdb = c.make(db0, DType::f32);
        cpu().matmul_backward(cdx, cdw, cdb, c.make(dout, DType::f32), c.make(x, DType::f32), c.make(w, DType::f32),
                              N, IC, OC);
        Tensor gdx = at(dx0, mode), gdw = at(dw0, DType::f32), gdb = at(db0, DType::f32);
        ops.matmul_backward(gdx, gdw, gdb, at(dout, mode), gx, gw, N, IC, OC);
        expect_close("dinp", g.read(gdx), c.read(cdx), tolerance(mode, mode));
        expect_close("dw", g.read(gdw), c.read(cdw), tolerance(mode, DType::f32));
        expect_close("dbias", g.read(gdb), c.read(cdb), tolerance(mode, DType::f32));
        Tensor gdb_only = at(db0, DType::f32), cdb_only = c.make(db0, DType::f32);
        ops.matmul_backward(Tensor{}, Tensor{}, gdb_only, at(dout, mode), Tensor{}, Tensor{}, N, IC, OC);
        cpu().matmul_backward(Tensor{}, Tensor{}, cdb_only, c.make(dout, DType::f32), Tensor{}, Tensor{}, N, IC, OC);
        expect_close("dbias alone", g.read(gdb_only), c.read(cdb_only), tolerance(mode, DType::f32));
      }
    }
  }
}

TEST_CASE("bias gradients are deterministic", "[gpu][ops][matmul]") {
  // The same call twice onto the same nonzero dbias gives bitwise the same result (and CpuOps's):
  // with many row chunks (N = 4099: 129 chunks of 32 rows, the last one short), through both
  // of the column reduction's load paths (OC = 771: scalar; OC = 768: 16 bytes) when dw is null
  // and through the dW product's BGRADB epilogue (where cuBLASLt has an algorithm) when it is
  // not, in both modes and gradient dtypes.
  const int N = 4099, IC = 64;
  for (DType mode : kModes) {
    for (DType grad : kModes) {
      if (mode == DType::f32 && grad == DType::bf16) continue;  // not a pair CudaOps takes
      for (int OC : {771, 768}) {
        for (bool with_dw : {false, true}) {
          INFO("mode " << mode_name(mode) << ", grad " << dtype_name(grad) << ", OC " << OC << ", dw " << with_dw);
          Ops& ops = gpu(mode);
          Tensors g(ops), c(cpu());
          const std::vector<float> dout = rounded(mode, random_normal(size_t(N) * OC, 1.0f, 28));
          const std::vector<float> db0 = rounded(grad, random_normal(OC, 50.0f, 29));
          Tensor gdout = g.make(dout, mode);
          Tensor ginp = with_dw ? g.make(random_normal(size_t(N) * IC, 1.0f, 30), mode) : Tensor{};
          std::vector<float> got[2];
          for (std::vector<float>& result : got) {
            Tensor gdb = g.make(db0, grad), gdw = with_dw ? g.zeros(size_t(OC) * IC, grad) : Tensor{};
            ops.matmul_backward(Tensor{}, gdw, gdb, gdout, ginp, Tensor{}, N, IC, OC);
            result = g.read(gdb);
          }
          CHECK(bitwise_equal(got[0], got[1]));
          Tensor cdb = c.make(db0, DType::f32);
          cpu().matmul_backward(Tensor{}, Tensor{}, cdb, c.make(dout, DType::f32), Tensor{}, Tensor{}, N, IC, OC);
          expect_close("dbias", got[0], c.read(cdb), tolerance(mode, grad));
        }
      }
    }
  }
}

TEST_CASE("matmul_backward's dW beside dinp (two streams) gives each product's bits alone", "[gpu][ops][matmul]") {
  // With dinp and dw both wanted, dW (and the bias gradient) runs on CudaOps' side stream with
  // its own workspace while dinp runs on the main one; each alone runs on the main stream. The
  // results must be the same bits, on every repeat, at shapes large enough for the two to
  // overlap (and with split-K partials in the workspaces), and the op that follows on the main
  // stream must see dW complete (read back right after).
  struct Shape {
    int N, IC, OC;
  };
  for (Shape s : {Shape{4096, 768, 2304}, Shape{8192, 3072, 768}, Shape{37, 771, 133}}) {
    for (DType mode : kModes) {
      INFO("N " << s.N << " IC " << s.IC << " OC " << s.OC << ", mode " << mode_name(mode));
      Ops& ops = gpu(mode);
      Tensors g(ops);
      const size_t NI = size_t(s.N) * s.IC, NO = size_t(s.N) * s.OC, WI = size_t(s.OC) * s.IC;
      Tensor x = g.make(rounded(mode, random_normal(NI, 1.0f, 41)), mode);
      Tensor w = g.make(rounded(mode, random_normal(WI, 0.05f, 42)), mode);
      Tensor dout = g.make(rounded(mode, random_normal(NO, 1.0f, 43)), mode);
      const std::vector<float> dw0 = random_normal(WI, 1.0f, 44), db0 = random_normal(s.OC, 1.0f, 45);
      // Alone: dinp, then dW with dbias, each its own call.
      Tensor dx_alone = g.zeros(NI, mode), dw_alone = g.make(dw0, DType::f32), db_alone = g.make(db0, DType::f32);
      ops.matmul_backward(dx_alone, Tensor{}, Tensor{}, dout, x, w, s.N, s.IC, s.OC);
      ops.matmul_backward(Tensor{}, dw_alone, db_alone, dout, x, w, s.N, s.IC, s.OC);
      const std::vector<float> ref_dx = g.read(dx_alone), ref_dw = g.read(dw_alone), ref_db = g.read(db_alone);
      for (int repeat = 0; repeat < 3; repeat++) {
        INFO("repeat " << repeat);
        Tensor dx = g.zeros(NI, mode), dw = g.make(dw0, DType::f32), db = g.make(db0, DType::f32);
        ops.matmul_backward(dx, dw, db, dout, x, w, s.N, s.IC, s.OC);
        CHECK(bitwise_equal(g.read(dx), ref_dx));
        CHECK(bitwise_equal(g.read(dw), ref_dw));
        CHECK(bitwise_equal(g.read(db), ref_db));
      }
    }
  }
}

TEST_CASE("gelu, add and scale through CudaOps match CpuOps", "[gpu][ops][elementwise]") {
  const size_t n = 100003;
  for (DType mode : kModes) {
    INFO("mode " << mode_name(mode));
    Ops& ops = gpu(mode);
    Tensors g(ops), c(cpu());
    const std::vector<float> a = rounded(mode, random_normal(n, 3.0f, 31));
    const std::vector<float> b = rounded(mode, random_normal(n, 1.0f, 32));
    Tensor ca = c.make(a, DType::f32), cb = c.make(b, DType::f32), cout = c.zeros(n, DType::f32);
    Tensor ga = g.make(a, mode), gb = g.make(b, mode), gout = g.zeros(n, mode);

    cpu().gelu_forward(cout, ca, n);
    g.poison(gout);
    ops.gelu_forward(gout, ga, n);
    expect_close("gelu", g.read(gout), c.read(cout), tolerance(mode, mode));

    const std::vector<float> d0 = rounded(mode, random_normal(n, 1.0f, 33));
    Tensor cd = c.make(d0, DType::f32), gd = g.make(d0, mode);
    cpu().gelu_backward(cd, ca, cb, n);
    ops.gelu_backward(gd, ga, gb, n);
    expect_close("gelu_backward", g.read(gd), c.read(cd), tolerance(mode, mode));

    cpu().add(cout, ca, cb, n);
    g.poison(gout);
    ops.add(gout, ga, gb, n);
    expect_close("add", g.read(gout), c.read(cout), tolerance(mode, mode));
    ops.add(ga, ga, gb, n);  // out aliases a
    expect_close("add in place", g.read(ga), c.read(cout), tolerance(mode, mode));

    cpu().scale(cb, -0.37f, n);
    ops.scale(gb, -0.37f, n);
    expect_close("scale", g.read(gb), c.read(cb), tolerance(mode, mode));
  }
}

TEST_CASE("softmax_cross_entropy matches CpuOps", "[gpu][ops][loss]") {
  const int N = 37;
  struct Vocab {
    int V, Vp;
  };
  // The kernels each shape takes in training (cross_entropy.cu; on an H100/H200), all with odd V
  // and padded columns but the last:
  //   1001/1008:     row on chip, 512 threads, registers only;
  //   50257/50304:   GPT-2; on chip, bf16: 512 threads, registers + shared memory; fp32: 1024;
  //   128000/128256: Llama 3; bf16: on chip, 1024 threads, registers + shared memory; fp32: too
  //                  long for on chip, the two-pass kernel with 16-byte loads;
  //   140001/140008: too long for on chip in both dtypes: two-pass, 16-byte;
  //   771/771:       not in 16-byte chunks: two-pass, scalar.
  // Eval (dloss 0) and the misaligned slice below always take the two-pass kernel.
  for (Vocab voc : {Vocab{1001, 1008}, Vocab{50257, 50304}, Vocab{128000, 128256}, Vocab{140001, 140008},
                    Vocab{771, 771}}) {
    for (DType mode : kModes) {
      INFO("V " << voc.V << " Vp " << voc.Vp << ", mode " << mode_name(mode));
      // In fp32 a row's sum of V exponentials carries about sqrt(V) roundings in CpuOps's serial
      // order (2e-5 relative at V = 140001, measured 1e-5 to 5e-5 against the kernels' tree order on
      // the H200, 2026-11-27), and every loss and dlogit inherits it: long rows get 1e-4.
      const double tol_loss = mode == DType::f32 && voc.V > 10000 ? 1e-4 : tolerance(mode, DType::f32);
      const double tol_dlogits = mode == DType::f32 && voc.V > 10000 ? 1e-4 : tolerance(mode, mode);
      Ops& ops = gpu(mode);
      Tensors g(ops), c(cpu());
      const size_t n = size_t(N) * voc.Vp;
      const std::vector<float> logits = rounded(mode, random_normal(n, 4.0f, 41));
      std::vector<int32_t> targets = random_ints(N, 0, voc.V, 42);
      targets[3] = -1;  // no target: loss 0, gradient 0
      targets[7] = voc.V - 1;
      // -inf logits (a masked-out token) contribute exp(-inf) = 0, also as the very first
      // element a thread sees, while its running max is still -inf (that must not give NaN).
      std::vector<float> logits_inf = logits;
      for (int i = 0; i < 3; ++i) logits_inf[size_t(5) * voc.Vp + i] = -INFINITY;
      logits_inf[size_t(6) * voc.Vp + voc.V / 2] = -INFINITY;
      logits_inf[size_t(6) * voc.Vp + voc.V - 1] = -INFINITY;  // in shared memory when the row has a part there
      targets[5] = voc.V - 2;
      for (bool with_inf : {false, true})
      for (float dloss : {1.0f / N, 0.0f}) {
        INFO("dloss " << dloss << ", -inf logits " << with_inf);
        const std::vector<float>& lg = with_inf ? logits_inf : logits;
        Tensor cl = c.make(lg, DType::f32), closs = c.zeros(N, DType::f32);
        cpu().softmax_cross_entropy(closs, cl, c.ints(targets), N, voc.V, voc.Vp, dloss);
        Tensor gl = g.make(lg, mode), gloss = g.zeros(N, DType::f32);
        g.poison(gloss);
        ops.softmax_cross_entropy(gloss, gl, g.ints(targets), N, voc.V, voc.Vp, dloss);
        expect_close("losses", g.read(gloss), c.read(closs), tol_loss);
        if (dloss != 0.0f)
          expect_close("dlogits", g.read(gl), c.read(cl), tol_dlogits);
        else
          CHECK(g.read(gl) == lg);  // eval leaves the logits untouched, bit for bit
        // Deterministic: the same inputs give the same bits.
        Tensor gl2 = g.make(lg, mode), gloss2 = g.zeros(N, DType::f32);
        ops.softmax_cross_entropy(gloss2, gl2, g.ints(targets), N, voc.V, voc.Vp, dloss);
        CHECK(bitwise_equal(g.read(gloss2), g.read(gloss)));
        CHECK(bitwise_equal(g.read(gl2), g.read(gl)));
      }
      // A misaligned row start (a slice at an odd offset): the scalar path, same results.
      {
        INFO("logits at an offset of one element");
        Tensor cl = c.make(logits, DType::f32), closs = c.zeros(N, DType::f32);
        cpu().softmax_cross_entropy(closs, cl, c.ints(targets), N, voc.V, voc.Vp, 1.0f / N);
        std::vector<float> shifted(1, 0.0f);
        shifted.insert(shifted.end(), logits.begin(), logits.end());
        Tensor gl = g.make(shifted, mode).slice(1, n), gloss = g.zeros(N, DType::f32);
        g.poison(gloss);
        ops.softmax_cross_entropy(gloss, gl, g.ints(targets), N, voc.V, voc.Vp, 1.0f / N);
        expect_close("losses", g.read(gloss), c.read(closs), tol_loss);
        expect_close("dlogits", g.read(gl), c.read(cl), tol_dlogits);
      }
    }
  }
}

TEST_CASE("adamw_update matches CpuOps", "[gpu][ops][optimizer]") {
  const size_t n = 100003;
  for (DType mode : kModes) {
    for (int t : {1, 5}) {
      INFO("mode " << mode_name(mode) << ", t " << t);
      Ops& ops = gpu(mode);
      Tensors g(ops), c(cpu());
      const std::vector<float> w = random_normal(n, 0.02f, 51), grad = random_normal(n, 1e-3f, 52);
      std::vector<float> m = random_normal(n, 1e-4f, 53), v = random_normal(n, 1e-7f, 54);
      for (float& x : v) x = std::fabs(x);
      Tensor cw = c.make(w, DType::f32), cg = c.make(grad, DType::f32), cm = c.make(m, DType::f32),
             cv = c.make(v, DType::f32);
      cpu().adamw_update(cw, cw, cg, cm, cv, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
      Tensor gmaster = g.make(w, DType::f32), gg = g.make(grad, DType::f32), gm = g.make(m, DType::f32),
             gv = g.make(v, DType::f32);
      // The fp32 backend's parameters ARE the master weights; bf16 gets a separate rounded copy.
      Tensor gparams = mode == DType::f32 ? gmaster : g.zeros(n, DType::bf16);
      if (mode == DType::bf16) g.poison(gparams);
      ops.adamw_update(gparams, gmaster, gg, gm, gv, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
      const std::vector<float> ref = c.read(cw);
      expect_close("master", g.read(gmaster), ref, tolerance(mode, DType::f32));
      expect_close("m", g.read(gm), c.read(cm), tolerance(mode, DType::f32));
      expect_close("v", g.read(gv), c.read(cv), tolerance(mode, DType::f32));
      if (mode == DType::bf16) expect_close("params", g.read(gparams), rounded(DType::bf16, ref), 1e-2);
    }
  }
}

TEST_CASE("sum and sum_squares match CpuOps and are deterministic", "[gpu][ops][reduce]") {
  // n = 9000011: all 1024 partial blocks loop over their 16-byte chunks (f32 about 2.2 times,
  // bf16 1.1); 1000003: fewer blocks, one pass; 5 and 0: little or nothing but the last partial
  // chunk. The same values at an odd offset (not 16-byte aligned: scalar loads) give the same
  // bits: the split depends on n alone.
  for (size_t n : {size_t{9000011}, size_t{1000003}, size_t{5}, size_t{0}}) {
    for (DType dtype : kModes) {
      INFO("n " << n << ", dtype " << dtype_name(dtype));
      Ops& ops = gpu(DType::bf16);
      Tensors g(ops), c(cpu());
      std::vector<float> x = rounded(dtype, random_normal(n, 1.0f, 61));
      for (float& v : x) v += 0.25f;  // a nonzero mean, so the sum is not ~0
      x = rounded(dtype, x);
      Tensor cx = c.make(x, DType::f32);
      Tensor gx = n ? g.make(x, dtype) : Tensor{nullptr, 0, dtype};
      const double s = ops.sum(gx, n), ss = ops.sum_squares(gx, n);
      const double rs = cpu().sum(cx, n), rss = cpu().sum_squares(cx, n);
      CHECK(std::fabs(s - rs) <= 1e-9 * std::max(1.0, std::fabs(rs)));
      CHECK(std::fabs(ss - rss) <= 1e-9 * std::max(1.0, rss));
      CHECK(ops.sum(gx, n) == s);  // bitwise: the split depends on n only
      CHECK(ops.sum_squares(gx, n) == ss);
      if (n > 0) {
        Tensor odd = g.make_at(x, dtype, 1);
        CHECK(ops.sum(odd, n) == s);
        CHECK(ops.sum_squares(odd, n) == ss);
      }
    }
  }
}

TEST_CASE("CudaOps rejects wrong dtypes and sizes with a message naming the argument", "[gpu][ops]") {
  Ops& ops = gpu(DType::bf16);
  Tensors g(ops);
  Tensor a = g.zeros(16, DType::bf16), b = g.zeros(16, DType::f32), i = g.zeros(16, DType::i32);
  CHECK_THROWS_WITH(ops.add(a, a, b, 16), Catch::Contains("b is f32"));
  CHECK_THROWS_WITH(ops.add(a, a, a, 17), Catch::Contains("holds 16 elements"));
  CHECK_THROWS_AS(ops.gelu_forward(i, i, 16), RuntimeError);
  CHECK_THROWS_AS(ops.adamw_update(a, b, b, b, b, 16, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0, 1.0f), RuntimeError);
  CHECK_NOTHROW(ops.synchronize());
}

TEST_CASE("matmul_gelu_forward and matmul_backward_input_dgelu match CpuOps and repeat bitwise",
          "[gpu][ops][matmul][gelu]") {
  // bf16 products run as one cuBLASLt call with the GELU epilogue where the heuristic takes it
  // (OC and IC multiples of 8: the aux leading dimension); odd shapes (OC = 133, IC = 771), the
  // tiny one, misaligned slices (offset 1) and fp32 mode take the two-step fallback. CpuOps is
  // the composition of matmul and GELU. Outputs start poisoned: both must be written in full.
  struct Shape {
    int N, IC, OC;
  };
  for (Shape s : {Shape{64, 768, 256}, Shape{37, 771, 133}, Shape{5, 16, 3}}) {
    for (DType mode : kModes) {
      for (size_t off : {size_t{0}, size_t{1}}) {
        for (bool with_bias : {true, false}) {
          INFO("N " << s.N << " IC " << s.IC << " OC " << s.OC << ", mode " << mode_name(mode) << ", offset " << off
                    << ", bias " << with_bias);
          Ops& ops = gpu(mode);
          Tensors g(ops), c(cpu());
          const size_t NI = size_t(s.N) * s.IC, NO = size_t(s.N) * s.OC, WI = size_t(s.OC) * s.IC;
          auto poisoned = [&](size_t n) {
            Tensor whole = g.zeros(n + off, mode);
            g.poison(whole);
            return whole.slice(off, n);
          };
          // Forward: the fc layer, inp [N, IC] -> pre, out [N, OC].
          const std::vector<float> x = rounded(mode, random_normal(NI, 1.0f, 71));
          const std::vector<float> w = rounded(mode, random_normal(WI, 0.05f, 72));
          const std::vector<float> b = rounded(mode, random_normal(s.OC, 0.5f, 73));
          Tensor cpre = c.zeros(NO, DType::f32), cout = c.zeros(NO, DType::f32);
          cpu().matmul_gelu_forward(cout, cpre, c.make(x, DType::f32), c.make(w, DType::f32),
                                    with_bias ? c.make(b, DType::f32) : Tensor{}, s.N, s.IC, s.OC);
          Tensor gx = g.make_at(x, mode, off), gw = g.make_at(w, mode, off);
          Tensor gb = with_bias ? g.make_at(b, mode, off) : Tensor{};
          std::vector<float> fwd[2][2];  // [run][pre, out]
          for (auto& run : fwd) {
            Tensor gpre = poisoned(NO), gout = poisoned(NO);
            ops.matmul_gelu_forward(gout, gpre, gx, gw, gb, s.N, s.IC, s.OC);
            run[0] = g.read(gpre), run[1] = g.read(gout);
          }
          expect_close("pre", fwd[0][0], c.read(cpre), tolerance(mode, mode));
          expect_close("out", fwd[0][1], c.read(cout), tolerance(mode, mode));
          CHECK(bitwise_equal(fwd[0][0], fwd[1][0]));
          CHECK(bitwise_equal(fwd[0][1], fwd[1][1]));

          // Backward: the fc projection (IC = its input width) with a GELU input, dpre [N, IC]
          // overwritten (the poison must not survive).
          const std::vector<float> dout = rounded(mode, random_normal(NO, 1.0f, 74));
          const std::vector<float> pre = rounded(mode, random_normal(NI, 1.5f, 75));
          Tensor cdpre = c.zeros(NI, DType::f32);
          cpu().matmul_backward_input_dgelu(cdpre, c.make(dout, DType::f32), c.make(w, DType::f32),
                                            c.make(pre, DType::f32), s.N, s.IC, s.OC);
          Tensor gdout = g.make_at(dout, mode, off), gpre_in = g.make_at(pre, mode, off);
          std::vector<float> bwd[2];
          for (auto& run : bwd) {
            Tensor gdpre = poisoned(NI);
            ops.matmul_backward_input_dgelu(gdpre, gdout, gw, gpre_in, s.N, s.IC, s.OC);
            run = g.read(gdpre);
          }
          expect_close("dpre", bwd[0], c.read(cdpre), tolerance(mode, mode));
          CHECK(bitwise_equal(bwd[0], bwd[1]));
        }
      }
    }
  }
}

TEST_CASE("the fused GELU is GPT-2's tanh form, forward and backward", "[gpu][ops][matmul][gelu]") {
  // An identity weight makes pre = x exactly, so out and dpre are the GELU and its derivative of
  // known bf16 values, compared element by element. Where cuBLASLt's epilogue runs (bf16, this
  // aligned shape), an erf-form GELU would fail in the negative tail: at x = -2.5 the two forms
  // differ by 2.6%, the bound is 2^-7 (the CPU's own tanh cancels there by ~1e-5 relative).
  const int N = 64, C = 64;
  Ops& ops = gpu(DType::bf16);
  Tensors g(ops), c(cpu());
  std::vector<float> x(size_t(N) * C), eye(size_t(C) * C, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -3.0f + 6.0f * float(i) / float(x.size() - 1);
  x = rounded(DType::bf16, x);
  for (int i = 0; i < C; ++i) eye[size_t(i) * C + i] = 1.0f;
  const std::vector<float> ones(x.size(), 1.0f), zero_bias(C, 0.0f);
  Tensor gx = g.make(x, DType::bf16), geye = g.make(eye, DType::bf16), gones = g.make(ones, DType::bf16);
  Tensor gpre = g.zeros(x.size(), DType::bf16), gout = g.zeros(x.size(), DType::bf16);
  Tensor gdpre = g.zeros(x.size(), DType::bf16);
  ops.matmul_gelu_forward(gout, gpre, gx, geye, g.make(zero_bias, DType::bf16), N, C, C);
  ops.matmul_backward_input_dgelu(gdpre, gones, geye, gx, N, C, C);
  Tensor cx = c.make(x, DType::f32), cones = c.make(ones, DType::f32);
  Tensor cout = c.zeros(x.size(), DType::f32), cgrad = c.zeros(x.size(), DType::f32);
  cpu().gelu_forward(cout, cx, x.size());
  cpu().gelu_backward(cgrad, cx, cones, x.size());
  const std::vector<float> pre = g.read(gpre), out = g.read(gout), dpre = g.read(gdpre);
  const std::vector<float> ref_out = c.read(cout), ref_grad = c.read(cgrad);
  CHECK(bitwise_equal(pre, x));
  int bad_out = 0, bad_grad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    // The derivative crosses zero near x = -0.75, where the reference's two terms cancel.
    bad_out += std::fabs(out[i] - ref_out[i]) > 0x1p-7 * std::fabs(ref_out[i]) + 1e-6;
    bad_grad += std::fabs(dpre[i] - ref_grad[i]) > 0x1p-7 * std::fabs(ref_grad[i]) + 1e-4;
  }
  CHECK(bad_out == 0);
  CHECK(bad_grad == 0);
}
