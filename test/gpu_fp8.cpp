// CudaOps' FP8 ops against CpuOps (the exact emulation, core/cpu/cpu_fp8.cpp):
//  - fp8_amax: the same f32 bit for bit, f32 and bf16 input, aligned and misaligned, n from 0 up;
//    over rows and over columns (Fp8Amax), ragged and 16-byte shapes, with infinities and NaNs;
//  - fp8_quantize: codes and scale_inv bit for bit, plain and transposed, e4m3 and e5m2, ragged
//    shapes (scalar paths) and 16-byte ones (vector paths), scales from three "ranks'" amaxes
//    (equal to, below and above the tensor's own: below makes values saturate); and with per-row
//    scales ("rowwise"), plain and transposed, codes and the scale_inv vector bit for bit; with
//    record_amax (delayed scaling): the record bit for bit, starting at 0, above x's amax (it
//    stays) and below (it rises), ragged, 16-byte and misaligned shapes, the codes and scale_inv
//    those of the call without it; the record accumulating across calls; the refusals;
//  - fp8_matmul: the same codes through both backends, relative L2 error within 1e-2 (bf16 out)
//    and 3e-4 (f32 out: kTolF32Out says why not 1e-5), with a bias, accumulating into f32 and
//    bf16, e4m3 x e4m3 and e5m2 (a gradient as a) x e4m3, bitwise equal across two runs;
//    tensorwise and rowwise (per-row scale vectors; compute capability 9.0+, else the refusal);
//    shapes cuBLASLt's FP8 rules refuse throw naming the shape.
// Inputs are bf16-representable floats, so CudaOps reading them as bf16 and CpuOps as f32 see the
// same numbers; they include zeros, signed zeros, bf16 subnormals (a subnormal scaled up by s must
// not be flushed: the kernels' mul has no .ftz), values at and beyond the formats' largest after
// scaling, and (quantize only) infinities and a NaN. Outputs are poisoned (0xFF: a NaN code, a NaN
// float) before every call. On a GPU without FP8 tensor cores (compute capability < 8.9) the
// product cases check the refusal and say they did not run; the casts run everywhere.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/common/fp8.h"
#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::gputest;

namespace {

const DType kFormats[] = {DType::f8e4m3, DType::f8e5m2};

// A host buffer seen as a CpuOps tensor (CpuOps works on host pointers; its alloc holds f32 and
// i32 only, so its FP8 codes live here too).
template <typename T>
Tensor host(std::vector<T>& v, DType dtype) {
  return Tensor{v.data(), v.size(), dtype};
}

float bf16_from_bits(uint16_t b) { return bf16_value(b); }

// Random bf16-representable values of rms ~`scale`, with specials mixed in: zeros of both signs,
// bf16 subnormals (the smallest few), values 2^8 and 2^16 times the scale (beyond e4m3's and
// e5m2's range once scaled by a small amax), and, when `nonfinite`, infinities and a NaN.
std::vector<float> test_values(size_t n, float scale, uint32_t seed, bool nonfinite = false) {
  std::vector<float> v = rounded(DType::bf16, random_normal(n, scale, seed));
  std::mt19937 rng(seed + 1000);
  std::uniform_int_distribution<int> pick(0, 15);
  for (size_t i = 0; i < n; i++) {
    switch (pick(rng)) {
      case 0: v[i] = (i & 1) ? -0.0f : 0.0f; break;
      case 1: v[i] = (i & 1 ? -1.0f : 1.0f) * bf16_from_bits(static_cast<uint16_t>(1 + i % 5)); break;  // subnormal
      case 2: v[i] = round_to(DType::bf16, v[i] * 256.0f); break;
      case 3: v[i] = round_to(DType::bf16, v[i] * 65536.0f); break;
      default: break;
    }
  }
  if (nonfinite && n >= 3) {
    v[0] = std::numeric_limits<float>::infinity();
    v[n / 2] = -std::numeric_limits<float>::infinity();
    v[n - 1] = std::numeric_limits<float>::quiet_NaN();  // positive: the bf16 upload keeps the sign
  }
  return v;
}

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// The largest magnitude of v as CpuOps computes it (the bits' max), for choosing amaxes.
float amax_of(const std::vector<float>& v) {
  uint32_t m = 0;
  for (float x : v)
    if (std::isfinite(x)) m = std::max(m, bits(x) & 0x7fffffffu);
  float r;
  std::memcpy(&r, &m, 4);
  return r;
}

std::vector<uint8_t> read_codes(Ops& ops, Tensor q) {
  std::vector<uint8_t> host_codes(q.numel);
  ops.download(host_codes.data(), q.dtype, q, q.numel);
  return host_codes;
}

// Where two code arrays first differ ("" when equal), for the failure message.
std::string first_difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& ref) {
  if (got.size() != ref.size()) return "sizes " + std::to_string(got.size()) + " vs " + std::to_string(ref.size());
  for (size_t i = 0; i < got.size(); i++)
    if (got[i] != ref[i])
      return "element " + std::to_string(i) + ": gpu " + std::to_string(got[i]) + ", cpu " + std::to_string(ref[i]);
  return "";
}

}  // namespace

TEST_CASE("fp8_amax matches CpuOps bit for bit", "[gpu][fp8]") {
  Ops& ops = gpu(DType::bf16);
  const size_t sizes[] = {0, 1, 5, 4099, (size_t(1) << 20) + 3};
  for (size_t n : sizes)
    for (DType dt : {DType::f32, DType::bf16})
      for (size_t offset : {size_t(0), size_t(1)}) {
        INFO("n " << n << ", " << dtype_name(dt) << ", offset " << offset);
        std::vector<float> x = test_values(n, 1.5f, static_cast<uint32_t>(n + offset));
        std::vector<float> ref(1, -1.0f);
        cpu().fp8_amax(host(ref, DType::f32), host(x, DType::f32), 1, static_cast<int>(n), Fp8Amax::tensor);
        Tensors t(ops);
        Tensor gx = t.make_at(x, dt, offset);
        Tensor amax = t.zeros(1, DType::f32);
        t.poison(amax);
        ops.fp8_amax(amax, gx, 1, static_cast<int>(n), Fp8Amax::tensor);
        const std::vector<float> got = t.read(amax);
        CHECK(bits(got[0]) == bits(ref[0]));
        CHECK(bits(ref[0]) == bits(n ? amax_of(x) : 0.0f));
      }
  // All subnormal: the amax is the largest subnormal, not 0 (no flush to zero).
  std::vector<float> tiny = {bf16_from_bits(3), -bf16_from_bits(7), bf16_from_bits(1)};
  Tensors t(ops);
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor amax = t.zeros(1, DType::f32);
    ops.fp8_amax(amax, t.make(tiny, dt), 3, 1, Fp8Amax::tensor);
    CHECK(bits(t.read(amax)[0]) == bits(bf16_from_bits(7)));
  }
}

TEST_CASE("fp8_quantize matches CpuOps bit for bit, plain and transposed", "[gpu][fp8]") {
  Ops& ops = gpu(DType::bf16);
  struct Shape {
    int rows, cols;
    size_t offset;  // 1: x at an odd element offset (no 16-byte loads)
  };
  // 1024 x 768: whole 64 x 64 tiles; 80 x 200 and 48 x 40: 16-byte chunks with partial tiles; 65 x 48,
  // 1 x 16, 37 x 771, 3 x 5: the transposed kernel's scalar paths (rows % 16, cols % 8), the plain
  // kernel's tail; offset 1: misaligned x; 0 rows: nothing but scale_inv.
  const Shape shapes[] = {{65, 48, 0},  {1, 16, 0},  {1024, 768, 0}, {80, 200, 0}, {48, 40, 0},
                          {37, 771, 0}, {64, 64, 1}, {3, 5, 0},      {0, 16, 0}};
  int seed = 1;
  for (const Shape& sh : shapes)
    for (DType fmt : kFormats)
      for (DType dt : {DType::f32, DType::bf16})
        for (int amax_case = 0; amax_case < 3; amax_case++) {
          const size_t n = size_t(sh.rows) * sh.cols;
          const std::vector<float> x = test_values(n, 2.0f, static_cast<uint32_t>(seed++), /*nonfinite=*/n >= 16);
          // Three ranks' amaxes: the tensor's own among smaller ones, all smaller (values beyond
          // the format's largest saturate), or one larger.
          const float own = n ? amax_of(x) : 0.0f;
          std::vector<float> amaxes = amax_case == 0   ? std::vector<float>{own * 0.5f, own, own * 0.25f}
                                      : amax_case == 1 ? std::vector<float>{own / 3, own / 300, own / 7}
                                                       : std::vector<float>{own, own * 1000.0f, 0.0f};
          for (bool transpose : {false, true}) {
            INFO(sh.rows << " x " << sh.cols << " offset " << sh.offset << ", " << dtype_name(dt) << " -> "
                         << dtype_name(fmt) << ", amaxes case " << amax_case << (transpose ? ", transposed" : ""));
            std::vector<float> xin = x, am = amaxes, ref_sinv(1, -1.0f);
            std::vector<uint8_t> ref(n, 0xAB);
            Tensor rq = host(ref, fmt);
            cpu().fp8_quantize(rq, host(ref_sinv, DType::f32), host(xin, DType::f32), host(am, DType::f32), 3,
                               sh.rows, sh.cols, transpose, false, Tensor{});

            Tensors t(ops);
            Tensor gx = t.make_at(x, dt, sh.offset);
            Tensor gam = t.make(amaxes, DType::f32);
            Tensor q = t.zeros(n + 1, fmt).slice(0, n);
            Tensor sinv = t.zeros(1, DType::f32);
            t.poison(q);
            t.poison(sinv);
            ops.fp8_quantize(q, sinv, gx, gam, 3, sh.rows, sh.cols, transpose, false, Tensor{});
            const std::vector<uint8_t> got = read_codes(ops, q);
            const std::string diff = first_difference(got, ref);
            INFO("first difference: " << diff);
            CHECK(diff.empty());
            CHECK(bits(t.read(sinv)[0]) == bits(ref_sinv[0]));
          }
        }
}

TEST_CASE("fp8_quantize keeps subnormal inputs: a tiny tensor scaled up by 2^126", "[gpu][fp8]") {
  // Every value a bf16 (and f32) subnormal: amax is one too, the scale 2^126 (the clamp), and
  // x * s lands in FP8's normal range. A flush to zero anywhere would give zero codes.
  Ops& ops = gpu(DType::bf16);
  std::vector<float> x;
  for (int i = 0; i < 48; i++) x.push_back((i % 3 ? 1.0f : -1.0f) * bf16_from_bits(static_cast<uint16_t>(1 + i)));
  for (DType fmt : kFormats)
    for (DType dt : {DType::f32, DType::bf16})
      for (bool transpose : {false, true}) {
        INFO(dtype_name(dt) << " -> " << dtype_name(fmt) << (transpose ? ", transposed" : ""));
        std::vector<float> xin = x, am(1), ref_sinv(1);
        std::vector<uint8_t> ref(x.size());
        cpu().fp8_amax(host(am, DType::f32), host(xin, DType::f32), 3, 16, Fp8Amax::tensor);
        cpu().fp8_quantize(host(ref, fmt), host(ref_sinv, DType::f32), host(xin, DType::f32), host(am, DType::f32), 1,
                           3, 16, transpose, false, Tensor{});
        CHECK(ref_sinv[0] == std::ldexp(1.0f, -126));
        CHECK(std::count(ref.begin(), ref.end(), uint8_t(0)) == 0);
        Tensors t(ops);
        Tensor gx = t.make(x, dt), gam = t.zeros(1, DType::f32), q = t.zeros(x.size(), fmt),
               sinv = t.zeros(1, DType::f32);
        t.poison(gam);
        ops.fp8_amax(gam, gx, 3, 16, Fp8Amax::tensor);
        CHECK(bits(t.read(gam)[0]) == bits(am[0]));
        t.poison(q);
        ops.fp8_quantize(q, sinv, gx, gam, 1, 3, 16, transpose, false, Tensor{});
        CHECK(first_difference(read_codes(ops, q), ref).empty());
        CHECK(bits(t.read(sinv)[0]) == bits(ref_sinv[0]));
      }
}

TEST_CASE("fp8_quantize of x and of x's transpose agree; the scale is a power of two", "[gpu][fp8]") {
  Ops& ops = gpu(DType::bf16);
  const int rows = 96, cols = 80;
  const std::vector<float> x = test_values(size_t(rows) * cols, 0.3f, 77);
  std::vector<float> xt(x.size());
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) xt[size_t(c) * rows + r] = x[size_t(r) * cols + c];
  Tensors t(ops);
  const std::vector<float> amax = {amax_of(x)};
  for (DType fmt : kFormats) {
    Tensor q = t.zeros(x.size(), fmt), qt = t.zeros(x.size(), fmt), s1 = t.zeros(1, DType::f32),
           s2 = t.zeros(1, DType::f32);
    ops.fp8_quantize(q, s1, t.make(x, DType::bf16), t.make(amax, DType::f32), 1, rows, cols, /*transpose=*/true,
                     false, Tensor{});
    ops.fp8_quantize(qt, s2, t.make(xt, DType::bf16), t.make(amax, DType::f32), 1, cols, rows, /*transpose=*/false,
                     false, Tensor{});
    CHECK(read_codes(ops, q) == read_codes(ops, qt));
    const float s = t.read(s1)[0];
    CHECK(bits(s) == bits(t.read(s2)[0]));
    int e = 0;
    CHECK(std::frexp(s, &e) == 0.5f);  // 2^(e-1): a power of two
  }
}

TEST_CASE("fp8_amax over rows and over columns matches CpuOps bit for bit", "[gpu][fp8]") {
  Ops& ops = gpu(DType::bf16);
  struct Shape {
    int rows, cols;
    size_t offset;
  };
  // 16-byte rows (the row kernel's vector path) and ragged ones (cols % 8, misaligned x: scalar);
  // 300 x 16 and 200 x 3: several column tiles' atomics per column; empty shapes write zeros.
  const Shape shapes[] = {{1, 1, 0},   {3, 5, 0},    {37, 771, 0}, {64, 64, 1}, {80, 200, 0},
                          {1024, 768, 0}, {300, 16, 0}, {200, 3, 0},  {0, 16, 0}, {16, 0, 0}};
  uint32_t seed = 500;
  for (const Shape& sh : shapes)
    for (DType dt : {DType::f32, DType::bf16})
      for (Fp8Amax over : {Fp8Amax::rows, Fp8Amax::cols}) {
        const bool rows = over == Fp8Amax::rows;
        INFO(sh.rows << " x " << sh.cols << " offset " << sh.offset << ", " << dtype_name(dt) << ", over "
                     << (rows ? "rows" : "cols"));
        const size_t n = size_t(sh.rows) * sh.cols, count = rows ? size_t(sh.rows) : size_t(sh.cols);
        std::vector<float> x0 = test_values(n, 1.5f, seed++, /*nonfinite=*/n >= 16);
        Tensors t(ops);
        Tensor gx = t.make_at(x0, dt, sh.offset);
        std::vector<float> x = t.read(gx), ref(count, -1.0f);  // what the GPU holds (a bf16 NaN's bits)
        cpu().fp8_amax(host(ref, DType::f32), host(x, DType::f32), sh.rows, sh.cols, over);
        Tensor amax = t.zeros(count + 1, DType::f32).slice(0, count);
        if (count) t.poison(amax);
        ops.fp8_amax(amax, gx, sh.rows, sh.cols, over);
        if (!count) continue;
        const std::vector<float> got = t.read(amax);
        size_t bad = 0;
        for (size_t i = 0; i < count; i++) bad += bits(got[i]) != bits(ref[i]);
        CHECK(bad == 0);
      }
}

TEST_CASE("fp8_quantize with per-row scales matches CpuOps bit for bit, plain and transposed", "[gpu][fp8]") {
  Ops& ops = gpu(DType::bf16);
  struct Shape {
    int rows, cols;
    size_t offset;
  };
  const Shape shapes[] = {{65, 48, 0},  {1, 16, 0},  {1024, 768, 0}, {80, 200, 0}, {48, 40, 0},
                          {37, 771, 0}, {64, 64, 1}, {3, 5, 0},      {0, 16, 0}};
  uint32_t seed = 900;
  for (const Shape& sh : shapes)
    for (DType fmt : kFormats)
      for (DType dt : {DType::f32, DType::bf16})
        for (bool transpose : {false, true})
          for (int amax_case = 0; amax_case < 3; amax_case++) {
            const size_t n = size_t(sh.rows) * sh.cols;
            const int R = transpose ? sh.cols : sh.rows;  // q's rows, one scale each
            std::vector<float> x = test_values(n, 2.0f, seed++, /*nonfinite=*/n >= 16);
            // Rows of very different magnitudes (powers of two keep the values bf16's), so
            // that per-row scales differ.
            for (int r = 0; r < sh.rows; r++)
              for (int c = 0; c < sh.cols; c++) x[size_t(r) * sh.cols + c] *= std::ldexp(1.0f, (r % 9) - 4);
            // Each q row's own amax (a NaN or infinity where x has one), then three "ranks'"
            // amaxes per row, laid out [3, R]: own among smaller ones, all smaller, one larger.
            // The reference quantises what the GPU holds: scaled subnormals are not all bf16's,
            // and a NaN's bits are the upload's.
            Tensors t(ops);
            Tensor gx = t.make_at(x, dt, sh.offset);
            x = t.read(gx);
            std::vector<float> own(R), xin = x;
            if (R) cpu().fp8_amax(host(own, DType::f32), host(xin, DType::f32), sh.rows, sh.cols,
                                  transpose ? Fp8Amax::cols : Fp8Amax::rows);
            std::vector<float> amaxes(3 * size_t(R));
            for (int i = 0; i < R; i++) {
              const float o = own[i];
              const float v[3] = {amax_case == 0 ? o * 0.5f : amax_case == 1 ? o / 3 : o,
                                  amax_case == 0 ? o : amax_case == 1 ? o / 300 : o * 1000.0f,
                                  amax_case == 0 ? o * 0.25f : amax_case == 1 ? o / 7 : 0.0f};
              for (int k = 0; k < 3; k++) amaxes[size_t(k) * R + i] = v[k];
            }
            INFO(sh.rows << " x " << sh.cols << " offset " << sh.offset << ", " << dtype_name(dt) << " -> "
                         << dtype_name(fmt) << ", amaxes case " << amax_case << (transpose ? ", transposed" : ""));
            std::vector<float> am = amaxes, ref_sinv(R, -1.0f);
            std::vector<uint8_t> ref(n, 0xAB);
            xin = x;
            cpu().fp8_quantize(host(ref, fmt), host(ref_sinv, DType::f32), host(xin, DType::f32), host(am, DType::f32),
                               3, sh.rows, sh.cols, transpose, true, Tensor{});

            Tensor gam = R ? t.make(amaxes, DType::f32) : Tensor{};
            Tensor q = t.zeros(n + 1, fmt).slice(0, n);
            Tensor sinv = t.zeros(size_t(R) + 1, DType::f32).slice(0, R);
            t.poison(q);
            if (R) t.poison(sinv);
            ops.fp8_quantize(q, sinv, gx, gam, 3, sh.rows, sh.cols, transpose, true, Tensor{});
            const std::string diff = first_difference(read_codes(ops, q), ref);
            INFO("first difference: " << diff);
            CHECK(diff.empty());
            if (R) {
              const std::vector<float> got = t.read(sinv);
              size_t bad = 0;
              for (int i = 0; i < R; i++) bad += bits(got[i]) != bits(ref_sinv[i]);
              CHECK(bad == 0);
            }
          }
}

TEST_CASE("fp8_quantize with record_amax records x's amax as CpuOps does, codes unchanged", "[gpu][fp8]") {
  Ops& ops = gpu(DType::bf16);
  struct Shape {
    int rows, cols;
    size_t offset;  // 1: x at an odd element offset (every kernel's scalar path)
  };
  // 3 x 5, 17 x 33, 130 x 70: the plain kernel's partial last chunk, the transposed kernel's
  // scalar paths and edge tiles; 64 x 64, 80 x 200: the vector paths (one tile, partial tiles);
  // 1024 x 768: hundreds of blocks' atomics on one record; offset 1: misaligned x; 0 rows:
  // nothing to record (the record is left as it was).
  const Shape shapes[] = {{3, 5, 0},   {17, 33, 0},  {64, 64, 0},    {130, 70, 0}, {80, 200, 0},
                          {64, 64, 1}, {17, 33, 1},  {1024, 768, 0}, {0, 16, 0}};
  uint32_t seed = 1300;
  for (const Shape& sh : shapes)
    for (DType fmt : kFormats)
      for (DType dt : {DType::f32, DType::bf16})
        for (bool transpose : {false, true})
          for (bool nonfinite : {false, true}) {
            const size_t n = size_t(sh.rows) * sh.cols;
            Tensors t(ops);
            Tensor gx = t.make_at(test_values(n, 2.0f, seed++, /*nonfinite=*/nonfinite && n >= 16), dt, sh.offset);
            const std::vector<float> x = t.read(gx);  // what the GPU holds (a bf16 NaN's bits: the upload's)
            // x's amax as fp8_amax gives it (a NaN when x has one), and the finite one for the scale.
            std::vector<float> xin = x, own(1, 0.0f);
            cpu().fp8_amax(host(own, DType::f32), host(xin, DType::f32), 1, static_cast<int>(n), Fp8Amax::tensor);
            const float finite = n ? amax_of(x) : 0.0f;
            const std::vector<float> amaxes = {finite};

            // The codes and scale_inv without a record, on the GPU: the recording call must match them.
            Tensor gam = t.make(amaxes, DType::f32);
            Tensor q0 = t.zeros(n + 1, fmt).slice(0, n), s0 = t.zeros(1, DType::f32);
            t.poison(q0);
            t.poison(s0);
            ops.fp8_quantize(q0, s0, gx, gam, 1, sh.rows, sh.cols, transpose, false, Tensor{});
            const std::vector<uint8_t> plain_codes = read_codes(ops, q0);
            const float plain_sinv = t.read(s0)[0];

            // The record starts at 0, above x's amax (it must stay) or below it (it must rise).
            for (int start_case = 0; start_case < 3; start_case++) {
              const float start = start_case == 0 ? 0.0f : start_case == 1 ? (n ? finite * 4.0f : 1.5f) : finite / 4;
              INFO(sh.rows << " x " << sh.cols << " offset " << sh.offset << ", " << dtype_name(dt) << " -> "
                           << dtype_name(fmt) << (transpose ? ", transposed" : "")
                           << (nonfinite ? ", with inf and NaN" : "") << ", record starts at " << start);
              std::vector<float> am = amaxes, ref_sinv(1, -1.0f), ref_rec(1, start);
              std::vector<uint8_t> ref(n, 0xAB);
              xin = x;
              cpu().fp8_quantize(host(ref, fmt), host(ref_sinv, DType::f32), host(xin, DType::f32),
                                 host(am, DType::f32), 1, sh.rows, sh.cols, transpose, false,
                                 host(ref_rec, DType::f32));

              Tensor q = t.zeros(n + 1, fmt).slice(0, n), sinv = t.zeros(1, DType::f32);
              // The record between two guards the kernels must not touch.
              Tensor rec_buf = t.make({7.0f, start, 7.0f}, DType::f32);
              Tensor rec = rec_buf.slice(1, 1);
              t.poison(q);
              t.poison(sinv);
              ops.fp8_quantize(q, sinv, gx, gam, 1, sh.rows, sh.cols, transpose, false, rec);
              const std::vector<float> got = t.read(rec_buf);
              CHECK(bits(got[1]) == bits(ref_rec[0]));
              CHECK(bits(got[0]) == bits(7.0f));
              CHECK(bits(got[2]) == bits(7.0f));
              // What the record must be: the larger of its start and x's amax (a NaN wins).
              if (n == 0 || (start_case == 1 && !std::isnan(own[0])))
                CHECK(bits(ref_rec[0]) == bits(start));
              else
                CHECK(bits(ref_rec[0]) == bits(own[0]));
              // Recording changes neither the codes nor scale_inv (GPU without a record, and CpuOps).
              const std::vector<uint8_t> codes = read_codes(ops, q);
              const std::string diff = first_difference(codes, plain_codes), cpu_diff = first_difference(codes, ref);
              INFO("first difference from the plain call: " << diff << "; from CpuOps: " << cpu_diff);
              CHECK(diff.empty());
              CHECK(cpu_diff.empty());
              const float s = t.read(sinv)[0];
              CHECK(bits(s) == bits(plain_sinv));
              CHECK(bits(s) == bits(ref_sinv[0]));
            }
          }
}

TEST_CASE("fp8_quantize's record_amax accumulates across calls; per-row and overlaps refused", "[gpu][fp8]") {
  Ops& ops = gpu(DType::bf16);
  Tensors t(ops);
  const int rows = 96, cols = 80;
  const size_t n = size_t(rows) * cols;
  // Two tensors, the second of larger magnitude, quantised into one record (no zeroing between):
  // it ends at the second's amax after either order, and a repeated call leaves it as it is.
  const std::vector<float> small = test_values(n, 0.5f, 1400), large = test_values(n, 8.0f, 1401);
  const float big = std::max(amax_of(small), amax_of(large));
  for (DType dt : {DType::f32, DType::bf16})
    for (bool transpose : {false, true})
      for (bool small_first : {true, false}) {
        INFO(dtype_name(dt) << (transpose ? ", transposed" : "") << (small_first ? ", small first" : ", large first"));
        Tensor rec = t.zeros(1, DType::f32), q = t.zeros(n, DType::f8e4m3), sinv = t.zeros(1, DType::f32);
        Tensor am = t.make({big}, DType::f32);
        Tensor a = t.make(small_first ? small : large, dt), b = t.make(small_first ? large : small, dt);
        ops.fp8_quantize(q, sinv, a, am, 1, rows, cols, transpose, false, rec);
        ops.fp8_quantize(q, sinv, b, am, 1, rows, cols, transpose, false, rec);
        CHECK(bits(t.read(rec)[0]) == bits(big));
        ops.fp8_quantize(q, sinv, b, am, 1, rows, cols, transpose, false, rec);
        CHECK(bits(t.read(rec)[0]) == bits(big));
      }
  // Refusals, before anything is launched.
  Tensor x = t.make(small, DType::f32), q = t.zeros(n, DType::f8e4m3), sinv = t.zeros(rows, DType::f32);
  Tensor am = t.make(std::vector<float>(rows, 1.0f), DType::f32), rec = t.zeros(1, DType::f32);
  CHECK_THROWS_WITH(ops.fp8_quantize(q, sinv, x, am, 1, rows, cols, false, true, rec), Catch::Contains("per-row"));
  CHECK_THROWS_WITH(ops.fp8_quantize(q, sinv, x, am, 1, rows, cols, false, false, x.slice(5, 1)),
                    Catch::Contains("record_amax overlaps"));
  CHECK_THROWS_WITH(ops.fp8_quantize(q, sinv, x, am, 1, rows, cols, false, false, sinv.slice(0, 1)),
                    Catch::Contains("record_amax overlaps"));
  CHECK_THROWS_WITH(ops.fp8_quantize(q, sinv, x, am, 1, rows, cols, false, false, am.slice(0, 1)),
                    Catch::Contains("record_amax overlaps"));
  CHECK_THROWS_AS(ops.fp8_quantize(q, sinv, x, am, 1, rows, cols, false, false, t.zeros(1, DType::bf16)),
                  RuntimeError);
  CHECK_THROWS_AS(ops.fp8_quantize(q, sinv, x, am, 1, rows, cols, false, false, rec.slice(0, 0)), RuntimeError);
}

namespace {

// A operand's codes and scale_inv, quantised once by CpuOps (the GPU test multiplies the same
// codes on both backends).
// per_row: one scale per row (scale_inv has `rows` entries), else one.
struct Quantised {
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv;
  DType fmt;
};

Quantised quantise_on_cpu(const std::vector<float>& v, int rows, int cols, DType fmt, bool per_row) {
  const size_t scales = per_row ? size_t(rows) : 1;
  Quantised q{std::vector<uint8_t>(v.size()), std::vector<float>(scales), fmt};
  std::vector<float> x = v, amax(scales);
  cpu().fp8_amax(host(amax, DType::f32), host(x, DType::f32), rows, cols, per_row ? Fp8Amax::rows : Fp8Amax::tensor);
  cpu().fp8_quantize(host(q.codes, fmt), host(q.scale_inv, DType::f32), host(x, DType::f32), host(amax, DType::f32),
                     1, rows, cols, false, per_row, Tensor{});
  return q;
}

// out as CpuOps computes it (f32): start (accumulate) + (a @ b^T) * scales (+ bias).
std::vector<float> cpu_fp8_matmul(Quantised& a, Quantised& b, std::vector<float> start, std::vector<float> bias, int M,
                                  int N, int K, bool accumulate, bool per_row) {
  std::vector<float> out = accumulate ? start : std::vector<float>(size_t(M) * N, 0.0f);
  cpu().fp8_matmul(host(out, DType::f32), host(a.codes, a.fmt), host(a.scale_inv, DType::f32), host(b.codes, b.fmt),
                   host(b.scale_inv, DType::f32), bias.empty() ? Tensor{} : host(bias, DType::f32), M, N, K,
                   accumulate, per_row);
  return out;
}

// Rows of very different magnitudes (powers of two: bf16 values stay bf16's), so that rowwise
// scales differ from row to row and from the tensorwise one.
std::vector<float> rows_spread(std::vector<float> v, int rows, int cols) {
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) v[size_t(r) * cols + c] *= std::ldexp(1.0f, (r % 11) - 5);
  return v;
}

}  // namespace

namespace {

// Relative L2 bounds of fp8_matmul against CpuOps on the same codes (every product is exact in
// fp32 on both sides, the scales are powers of two): bf16 out, one rounding to bf16 (~2^-9):
// 1e-2 as for every bf16 output (gpu_test_support.h). f32 out: beyond the order of the fp32 sum
// (~1e-6), Hopper's FP8 tensor cores keep only ~14 bits while they add the products of one MMA
// sequence, between cuBLASLt's promotions to fp32 (DeepSeek-V3 report, 3.3.2; fast accumulation
// is off), so ~2^-14 relative per partial: measured on an H200 (2026-11-28) 5.6e-5 to 1.25e-4
// over these shapes (the largest at K = 2304, e4m3 x e4m3), so 3e-4, still far below what a
// wrong layout, scale or bias gives (O(1)). The test prints each case's error.
constexpr double kTolBf16Out = 1e-2;
constexpr double kTolF32Out = 3e-4;

}  // namespace

TEST_CASE("fp8_matmul matches CpuOps on the same codes and repeats bitwise", "[gpu][fp8][matmul]") {
  Ops& ops = gpu(DType::bf16);
  if (!ops.supports_fp8()) {
    Tensors t(ops);
    Tensor a = t.zeros(16 * 16, DType::f8e4m3), s = t.make({1.0f}, DType::f32), out = t.zeros(16 * 16, DType::bf16);
    CHECK_THROWS_WITH(ops.fp8_matmul(out, a, s, a, s, Tensor{}, 16, 16, 16, false, false),
                      Catch::Contains("compute capability 8.9"));
    WARN("no FP8 tensor cores on " << ops.device_description()
                                    << ": fp8_matmul not checked (it refuses, as it should)");
    return;
  }
  struct Shape {
    int M, N, K;
  };
  const Shape shapes[] = {{128, 64, 96}, {512, 768, 2304}, {37, 64, 96}};  // M (cuBLASLt's n) is free
  const std::pair<DType, DType> formats[] = {{DType::f8e4m3, DType::f8e4m3}, {DType::f8e5m2, DType::f8e4m3}};
  const bool rowwise_ok = ops.supports_fp8_rowwise();  // cuBLASLt's outer-vector scales: Hopper and later
  uint32_t seed = 100;
  for (bool per_row : {false, true})
    for (const Shape& sh : shapes)
      for (const auto& [fa, fb] : formats) {
        const int M = sh.M, N = sh.N, K = sh.K;
        // a: activations (rms 1) or, as e5m2, a gradient (rms 1e-3); b: weights (rms 0.02).
        const float a_rms = fa == DType::f8e5m2 ? 1e-3f : 1.0f;
        Quantised qa = quantise_on_cpu(
            rows_spread(rounded(DType::bf16, random_normal(size_t(M) * K, a_rms, seed++)), M, K), M, K, fa, per_row);
        Quantised qb = quantise_on_cpu(
            rows_spread(rounded(DType::bf16, random_normal(size_t(N) * K, 0.02f, seed++)), N, K), N, K, fb, per_row);
        const double out_rms = a_rms * 0.02 * std::sqrt(double(K));
        const std::vector<float> bias = rounded(DType::bf16, random_normal(N, static_cast<float>(out_rms), seed++));
        const std::vector<float> start =
            rounded(DType::bf16, random_normal(size_t(M) * N, static_cast<float>(out_rms), seed++));

        Tensors t(ops);
        Tensor ga = t.zeros(qa.codes.size(), fa), gb = t.zeros(qb.codes.size(), fb);
        ops.upload(ga, qa.codes.data(), fa, qa.codes.size());
        ops.upload(gb, qb.codes.data(), fb, qb.codes.size());
        Tensor gas = t.make(qa.scale_inv, DType::f32), gbs = t.make(qb.scale_inv, DType::f32);

        if (per_row && !rowwise_ok) {
          Tensor out = t.zeros(size_t(M) * N, DType::bf16);
          CHECK_THROWS_WITH(ops.fp8_matmul(out, ga, gas, gb, gbs, Tensor{}, M, N, K, false, true),
                            Catch::Contains("compute capability 9.0"));
          continue;
        }
        for (int mode = 0; mode < 3; mode++) {  // 0: plain, 1: with bias, 2: accumulate
          const bool with_bias = mode == 1, accumulate = mode == 2;
          // One reference for both output dtypes: bias and start are bf16 values, exact in either.
          const std::vector<float> ref =
              cpu_fp8_matmul(qa, qb, start, with_bias ? bias : std::vector<float>{}, M, N, K, accumulate, per_row);
          for (DType od : {DType::bf16, DType::f32}) {
            INFO("M " << M << " N " << N << " K " << K << ", a " << dtype_name(fa) << " b " << dtype_name(fb) << ", out "
                      << dtype_name(od) << (with_bias ? ", bias" : "") << (accumulate ? ", accumulate" : "")
                      << (per_row ? ", rowwise" : ", tensorwise"));
            Tensor out = t.zeros(size_t(M) * N, od);
            Tensor gbias = with_bias ? t.make(bias, od) : Tensor{};
            std::vector<std::vector<float>> runs;
            for (int run = 0; run < 2; run++) {
              if (accumulate)
                ops.upload(out, start.data(), DType::f32, start.size());
              else
                t.poison(out);
              ops.fp8_matmul(out, ga, gas, gb, gbs, gbias, M, N, K, accumulate, per_row);
              runs.push_back(t.read(out));
            }
            const double err = relative_l2(runs[0], ref);
            std::printf("fp8_matmul M=%d N=%d K=%d a %s b %s out %s%s%s%s: relative L2 error %.2e\n", M, N, K,
                        dtype_name(fa), dtype_name(fb), dtype_name(od), with_bias ? " bias" : "",
                        accumulate ? " accumulate" : "", per_row ? " rowwise" : "", err);
            expect_close("out", runs[0], ref, od == DType::bf16 ? kTolBf16Out : kTolF32Out);
            CHECK(bitwise_equal(runs[0], runs[1]));
          }
        }
      }
  if (!rowwise_ok) WARN("compute capability below 9.0: rowwise fp8_matmul refuses (checked), not run");
}

TEST_CASE("fp8_matmul refuses what cuBLASLt's FP8 products cannot take, naming the shape", "[gpu][fp8][matmul]") {
  Ops& ops = gpu(DType::bf16);
  if (!ops.supports_fp8()) {
    WARN("no FP8 tensor cores on " << ops.device_description() << ": not checked");
    return;
  }
  Tensors t(ops);
  Tensor a = t.zeros(64 * 64, DType::f8e4m3), g = t.zeros(64 * 64, DType::f8e5m2), s = t.make({1.0f}, DType::f32);
  Tensor out = t.zeros(64 * 64, DType::bf16);
  CHECK_THROWS_WITH(ops.fp8_matmul(out, a, s, a, s, Tensor{}, 32, 32, 40, false, false), Catch::Contains("K=40"));
  CHECK_THROWS_WITH(ops.fp8_matmul(out, a, s, a, s, Tensor{}, 32, 24, 32, false, false), Catch::Contains("N=24"));
  CHECK_THROWS_WITH(ops.fp8_matmul(out, g, s, g, s, Tensor{}, 32, 32, 32, false, false), Catch::Contains("e5m2"));
  CHECK_THROWS_AS(ops.fp8_matmul(out, a.slice(1, 32 * 32), s, a, s, Tensor{}, 32, 32, 32, false, false), RuntimeError);
  CHECK_THROWS_AS(ops.fp8_matmul(out, a, s, a, s, t.make(std::vector<float>(32, 0.0f), DType::bf16), 32, 32, 32, true,
                                 false),
                  RuntimeError);
  // Rowwise: one scale where M (or N) are needed; below compute capability 9.0 the refusal first.
  CHECK_THROWS_AS(ops.fp8_matmul(out, a, s, a, s, Tensor{}, 32, 32, 32, false, true), RuntimeError);
}

TEST_CASE("fp8_dequantize matches CpuOps bit for bit: every code, f32 and bf16, misaligned", "[gpu][fp8]") {
  Ops& ops = gpu(DType::bf16);
  const float scale_inv = std::ldexp(1.0f, -5);
  for (DType fmt : kFormats)
    for (DType dt : {DType::f32, DType::bf16})
      for (size_t n : {size_t(1), size_t(7), size_t(4099), (size_t(1) << 20) + 3})
        for (size_t offset : {size_t(0), size_t(1), size_t(3)}) {
          INFO(dtype_name(fmt) << " -> " << dtype_name(dt) << ", n " << n << ", codes at offset " << offset);
          std::vector<uint8_t> codes(n);
          for (size_t i = 0; i < n; i++) codes[i] = static_cast<uint8_t>((i * 37 + 11) % 256);  // every code
          std::vector<float> sinv = {scale_inv}, ref(n);
          cpu().fp8_dequantize(host(ref, DType::f32), host(codes, fmt), host(sinv, DType::f32), n);
          Tensors t(ops);
          const Tensor q = t.zeros(n + offset, fmt).slice(offset, n);
          ops.upload(q, codes.data(), fmt, n);
          const Tensor out = t.zeros(n, dt);
          t.poison(out);
          ops.fp8_dequantize(out, q, t.make(sinv, DType::f32), n);
          const std::vector<float> got = t.read(out);
          size_t wrong = 0;
          for (size_t i = 0; i < n; i++)
            if (!(std::isnan(ref[i]) ? std::isnan(got[i]) : bits(got[i]) == bits(ref[i]))) wrong++;
          CHECK(wrong == 0);
        }
}
