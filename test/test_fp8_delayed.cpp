// Delayed FP8 scaling (precision.fp8 = "delayed", core/parallel/fp8_delayed.h): the cast that
// records its input's amax (Ops::fp8_quantize's record_amax), the amax history (a step's records
// pushed, the oldest evicted, a skipped step dropped, restored from a checkpoint of another
// length), and the FP8 layer under it: its first step scales as tensorwise does, bit for bit;
// later steps scale by the history, so a tensor that outgrew it saturates.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/common/fp8.h"
#include "core/cpu/cpu_ops.h"
#include "core/dist/local_comm.h"
#include "core/parallel/fp8_delayed.h"
#include "core/parallel/fp8_linear.h"
#include "cpu_test_support.h"
#include "relative_error.h"

using namespace pt;
using namespace pt::test;

namespace {

// Records `value` as site's operand amax in the step's records (a cast of a one-element tensor).
void record(CpuOps& ops, Buffers& buf, Fp8Delayed& d, int site, Fp8Delayed::Operand o, float value) {
  const Tensor q = buf.zeros(1, DType::f8e4m3), sinv = buf.zeros(1), one = buf.f32({1.0f});
  ops.fp8_quantize(q, sinv, buf.f32({value}), one, 1, 1, 1, false, false, d.record(site, o));
}

float read1(Buffers& buf, Tensor t) { return buf.read(t)[0]; }

}  // namespace

TEST_CASE("fp8_quantize records the largest magnitude it cast, on top of what was recorded", "[fp8][delayed]") {
  CpuOps ops;
  Buffers buf(ops);
  const int rows = 4, cols = 5;
  std::vector<float> x = random_floats(size_t(rows) * cols, 3, -2.0f, 2.0f);
  x[7] = -6.5f;
  const Tensor q = buf.zeros(x.size(), DType::f8e4m3), sinv = buf.zeros(1), amax = buf.f32({8.0f});
  for (bool transpose : {false, true}) {
    INFO((transpose ? "transposed" : "plain"));
    const Tensor rec = buf.zeros(1);
    ops.fp8_quantize(q, sinv, buf.f32(x), amax, 1, rows, cols, transpose, false, rec);
    CHECK(read1(buf, rec) == 6.5f);  // rises from 0
    const Tensor above = buf.f32({9.0f});
    ops.fp8_quantize(q, sinv, buf.f32(x), amax, 1, rows, cols, transpose, false, above);
    CHECK(read1(buf, above) == 9.0f);  // stays
    // The codes and scale are the same with and without recording.
    const Tensor q2 = buf.zeros(x.size(), DType::f8e4m3), sinv2 = buf.zeros(1);
    ops.fp8_quantize(q2, sinv2, buf.f32(x), amax, 1, rows, cols, transpose, false, Tensor{});
    CHECK(std::memcmp(q.data, q2.data, x.size()) == 0);
    CHECK(read1(buf, sinv) == read1(buf, sinv2));
  }
  // A NaN records as a NaN (the largest bit pattern), as fp8_amax takes it.
  x[2] = std::numeric_limits<float>::quiet_NaN();
  const Tensor rec = buf.f32({1e30f});
  ops.fp8_quantize(q, sinv, buf.f32(x), amax, 1, rows, cols, false, false, rec);
  CHECK(std::isnan(read1(buf, rec)));
  // One amax records one tensor: not per-row scales.
  const Tensor sinv_rows = buf.zeros(rows), amax_rows = buf.f32(std::vector<float>(rows, 1.0f));
  CHECK_THROWS(ops.fp8_quantize(q, sinv_rows, buf.f32(x), amax_rows, 1, rows, cols, false, true, buf.zeros(1)));
}

TEST_CASE("the amax history: pushed each step, the oldest evicted, skipped steps dropped", "[fp8][delayed]") {
  CpuOps ops;
  Buffers buf(ops);
  LocalComm tp(0, ops), dp_cp(0, ops);
  using D = Fp8Delayed;
  D d(ops, /*sites=*/2, /*history=*/3, tp, &dp_cp);
  CHECK_FALSE(d.has_history());
  const float steps[][2] = {{2.0f, 0.5f}, {7.0f, 0.25f}, {3.0f, 1.0f}, {1.5f, 0.125f}};
  for (int s = 0; s < 4; s++) {
    d.begin_step();
    // Two micro-batches: the record keeps the larger.
    record(ops, buf, d, 1, D::kDout, steps[s][0] / 2);
    record(ops, buf, d, 1, D::kDout, steps[s][0]);
    record(ops, buf, d, 0, D::kX, steps[s][1]);
    d.end_step(true);
    CHECK(d.has_history());
    if (s == 2) {  // three steps: the largest of 2, 7, 3
      CHECK(read1(buf, d.scale_amax(1, D::kDout)) == 7.0f);
      CHECK(read1(buf, d.scale_amax(0, D::kX)) == 1.0f);
    }
  }
  // Step 4 evicted step 1; the history is 7, 3, 1.5 (oldest first) and its max 7 still.
  CHECK(read1(buf, d.scale_amax(1, D::kDout)) == 7.0f);
  CHECK(read1(buf, d.scale_amax(0, D::kX)) == 1.0f);
  CHECK(d.histories()[1] == std::vector<float>{0, 0, 7, 0, 0, 3, 0, 0, 1.5f});
  CHECK(d.histories()[0] == std::vector<float>{0.25f, 0, 0, 1, 0, 0, 0.125f, 0, 0});
  // A skipped step records but pushes nothing.
  d.begin_step();
  record(ops, buf, d, 1, D::kDout, 100.0f);
  d.end_step(false);
  CHECK(read1(buf, d.scale_amax(1, D::kDout)) == 7.0f);
  // begin_step clears what an evaluation between steps recorded.
  d.begin_step();
  CHECK(read1(buf, d.record(1, D::kDout)) == 0.0f);
  // Two more steps evict 7 and 3.
  for (float v : {0.75f, 0.5f}) {
    d.begin_step();
    record(ops, buf, d, 1, D::kDout, v);
    d.end_step(true);
  }
  CHECK(read1(buf, d.scale_amax(1, D::kDout)) == 1.5f);
}

TEST_CASE("the amax history restores from a checkpoint, of any length, or starts afresh", "[fp8][delayed][ckpt]") {
  CpuOps ops;
  Buffers buf(ops);
  LocalComm tp(0, ops);
  using D = Fp8Delayed;
  D d(ops, 2, 3, tp, nullptr);
  // Site 0 saved with 4 steps (oldest first): the newest 3 are kept; site 1 with 2: padded.
  const std::vector<float> four = {9, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4}, two = {5, 6, 7, 8, 0.5f, 1};
  d.restore({four, two});
  CHECK(d.has_history());
  CHECK(d.histories()[0] == std::vector<float>{2, 2, 2, 3, 3, 3, 4, 4, 4});
  CHECK(d.histories()[1] == std::vector<float>{0, 0, 0, 5, 6, 7, 8, 0.5f, 1});
  CHECK(read1(buf, d.scale_amax(0, D::kX)) == 4.0f);  // 9 was the evicted step's
  CHECK(read1(buf, d.scale_amax(1, D::kW)) == 6.0f);
  // The next push overwrites the oldest row.
  d.begin_step();
  record(ops, buf, d, 0, D::kX, 1.0f);
  d.end_step(true);
  CHECK(d.histories()[0] == std::vector<float>{3, 3, 3, 4, 4, 4, 1, 0, 0});
  // A checkpoint without histories: none, dynamic scaling until the next step.
  d.restore({});
  CHECK_FALSE(d.has_history());
  CHECK(read1(buf, d.scale_amax(0, D::kX)) == 0.0f);
}

TEST_CASE("an FP8 layer under delayed scaling: tensorwise's first step, then the history's scales",
          "[fp8][delayed]") {
  CpuOps ops;
  Buffers buf(ops);
  LocalComm tp(0, ops);
  const int N = 8, IC = 12, OC = 6;
  const std::vector<float> x = random_floats(size_t(N) * IC, 21, -2, 2), w = random_floats(size_t(OC) * IC, 22, -0.3f, 0.3f),
                           dout = random_floats(size_t(N) * OC, 23, -1e-3f, 1e-3f);
  const Fp8Site site{1};
  Fp8Delayed state(ops, 2, 4, tp, nullptr);
  Fp8Linear delayed(ops, tp, nullptr, Fp8Format::e5m2), dynamic(ops, tp, nullptr, Fp8Format::e5m2);
  delayed.set_delayed(&state);
  const auto run = [&](Fp8Linear& layer, const std::vector<float>& xv) {
    const Tensor out = buf.zeros(size_t(N) * OC), dinp = buf.zeros(size_t(N) * IC), dw = buf.zeros(size_t(OC) * IC);
    layer.forward(out, buf.f32(xv), false, buf.f32(w), Tensor{}, N, IC, OC, site);
    layer.backward(dinp, dw, Tensor{}, buf.f32(dout), false, buf.f32(xv), false, buf.f32(w), N, IC, OC, site);
    return std::vector<std::vector<float>>{buf.read(out), buf.read(dinp), buf.read(dw)};
  };
  const auto largest = [](const std::vector<float>& v) {
    float m = 0;
    for (float f : v) m = std::max(m, std::fabs(f));
    return m;
  };
  // Step 1: no history, so the scales are the tensors' own, as tensorwise's, bit for bit; the
  // casts record x's, w's and dout's amaxes.
  state.begin_step();
  CHECK(run(delayed, x) == run(dynamic, x));
  using D = Fp8Delayed;
  CHECK(read1(buf, state.record(1, D::kX)) == largest(x));
  CHECK(read1(buf, state.record(1, D::kW)) == largest(w));
  CHECK(read1(buf, state.record(1, D::kDout)) == largest(dout));
  CHECK(read1(buf, state.record(0, D::kX)) == 0.0f);  // another site's: untouched
  state.end_step(true);
  // Step 2: x has grown 8x. The history's scale keeps step 1's exponent, so x's large values
  // saturate at e4m3's 448 / s; the dynamic layer rescales and does not.
  std::vector<float> big = x;
  for (float& v : big) v *= 8;
  state.begin_step();
  const std::vector<float> out = run(delayed, big)[0], out_dynamic = run(dynamic, big)[0];
  const int k = fp8_scale_exponent(largest(x), Fp8Format::e4m3), kw = fp8_scale_exponent(largest(w), Fp8Format::e4m3);
  std::vector<float> want(size_t(N) * OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = 0;
      for (int i = 0; i < IC; i++) {
        const float xq = std::ldexp(fp8_decode(fp8_encode(std::ldexp(big[size_t(n) * IC + i], k), Fp8Format::e4m3), Fp8Format::e4m3), -k);
        const float wq = std::ldexp(fp8_decode(fp8_encode(std::ldexp(w[size_t(o) * IC + i], kw), Fp8Format::e4m3), Fp8Format::e4m3), -kw);
        s += double(xq) * wq;
      }
      want[size_t(n) * OC + o] = float(s);
    }
  CHECK(relative_l2(out, want) < 1e-6);
  CHECK(relative_l2(out, out_dynamic) > 1e-2);  // the saturation shows
  CHECK(read1(buf, state.record(1, D::kX)) == largest(big));  // and the next step's scale will cover it
  // Rowwise scales are per row of each product's operand: no history of them.
  Fp8Linear rowwise(ops, tp, nullptr, Fp8Format::e5m2, /*rowwise=*/true);
  CHECK_THROWS(rowwise.set_delayed(&state));
}
