// Rotary position embedding (Hugging Face Llama's rotate-half convention), in place on the q and
// k heads of packed q|k|v rows.
//  forward:  for i < HS/2, (x[i], x[i+HS/2]) <- (x[i] c - x[i+HS/2] s, x[i+HS/2] c + x[i] s)
//  backward: the transpose, the same rotation by -angle (s -> -s).
// with angle = float(pos[t]) * inv_freq_i (core/ops/rope_frequencies.h), c = cosf, s = sinf.
// The angles depend on (t, i) only, so a [T, HS/2] table of (c, s) is built once per call and
// shared by the B rows and rot_heads heads that use it: T*HS/2 sin/cos pairs instead of
// B*T*rot_heads*HS/2. Each element is then 6 FLOPs; the op moves 2 * B*T*rot_heads*HS*4 bytes
// (read and write the rotated heads). Rows are independent: thread-count independent results.
#include <cmath>
#include <string>
#include <vector>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_ops.h"
#include "core/ops/rope_frequencies.h"

namespace pt {

namespace {

// sign = +1: forward; -1: backward (the rotation by -angle is the transpose).
void rope_rotate(const char* op, Tensor qkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS,
                 float theta, float sign) {
  const std::string bad = rope_shape_error(B, T, row_width, rot_heads, HS, theta);
  check(bad.empty(), std::string("CpuOps::") + op + ": " + bad);
  float* x = cpu::f32_arg(qkv, size_t(B) * T * row_width, op, "qkv");
  const int32_t* p = cpu::i32_arg(pos, T, op, "pos");
  const int half = HS / 2;

  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; i++) inv_freq[i] = rope_inv_freq(i, HS, theta);
  std::vector<float> cos_t(size_t(T) * half), sin_t(size_t(T) * half);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < half; i++) {
      float angle = static_cast<float>(p[t]) * inv_freq[i];  // one float multiply, as PyTorch
      cos_t[size_t(t) * half + i] = std::cos(angle);
      sin_t[size_t(t) * half + i] = sign * std::sin(angle);
    }
  }

  const long long rows = static_cast<long long>(B) * T;
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < rows; r++) {
    const float* c = &cos_t[size_t(r % T) * half];
    const float* s = &sin_t[size_t(r % T) * half];
    for (int h = 0; h < rot_heads; h++) {
      float* lo = x + size_t(r) * row_width + size_t(h) * HS;
      float* hi = lo + half;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        float a = lo[i], b = hi[i];
        lo[i] = a * c[i] - b * s[i];
        hi[i] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace

void CpuOps::rope_forward(Tensor qkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS, float theta) {
  rope_rotate("rope_forward", qkv, pos, B, T, row_width, rot_heads, HS, theta, 1.0f);
}

void CpuOps::rope_backward(Tensor dqkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS, float theta) {
  rope_rotate("rope_backward", dqkv, pos, B, T, row_width, rot_heads, HS, theta, -1.0f);
}

}  // namespace pt
