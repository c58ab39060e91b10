// Causal multi-head self-attention, GPT-2's: scale 1/sqrt(HS), query t attends to keys 0..t.
// qkv[B, T, 3C] holds q | k | v per token, head h at channels [h*HS, (h+1)*HS) of each part.
//  forward:  per (b, h, t): s_j = scale * q_t.k_j (j <= t), lse_t = log sum_j exp(s_j),
//            out_t = sum_j exp(s_j - lse_t) v_j, written to out[b, t, h*HS : (h+1)*HS].
//  backward: the flash-attention recurrence, recomputing P from q, k and lse (nothing T x T is
//            kept between calls): D_t = dO_t.O_t, dP_tj = dO_t.v_j, dS_tj = P_tj (dP_tj - D_t),
//            dq_t += scale sum_j dS_tj k_j, dk_j += scale sum_t dS_tj q_t, dv_j += sum_t P_tj dO_t.
// FLOPs (causal, ~T^2/2 pairs per (b, h)): forward ~2*B*NH*T^2*HS (q.k and p*v),
// backward ~4*B*NH*T^2*HS (q.k, dO.v, dS*k, dS*q, P*dO: 5 products of 2 FLOPs per pair and
// channel over half the matrix). Bytes: qkv, out, dout, lse once each; K and V rows are reused
// from cache across queries, so at GPT-2 shapes it is compute-bound.
// Parallel over (b, h, t) forward and over (b, h) backward: a (b, h) pair owns its head's
// channels of dqkv for all of its tokens, so dk/dv accumulate race-free in a fixed order.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

namespace {

struct AttentionShape {
  int B, T, C, NH, HS;
  float scale;
  AttentionShape(const char* op, int B_, int T_, int C_, int NH_) : B(B_), T(T_), C(C_), NH(NH_) {
    cpu::check_dims(op, {B, T, C});
    check(NH > 0 && C % NH == 0, std::string("CpuOps::") + op + ": n_heads=" + std::to_string(NH) +
                                     " must be positive and divide C=" + std::to_string(C));
    HS = C / NH;
    scale = 1.0f / std::sqrt(static_cast<float>(HS));
  }
  size_t tokens() const { return size_t(B) * T; }
  // Offsets of token (b, t), head h: into qkv (q; add C for k, 2C for v) and into out / dout.
  size_t qkv_at(int b, int t, int h) const { return (size_t(b) * T + t) * 3 * C + size_t(h) * HS; }
  size_t out_at(int b, int t, int h) const { return (size_t(b) * T + t) * C + size_t(h) * HS; }
  size_t lse_at(int b, int h, int t) const { return (size_t(b) * NH + h) * T + t; }
};

inline float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

// y += a * x
inline void axpy(float* y, float a, const float* x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

}  // namespace

void CpuOps::attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH) {
  AttentionShape s("attention_forward", B, T, C, NH);
  float* o = cpu::f32_arg(out, s.tokens() * C, "attention_forward", "out");
  float* l = cpu::f32_arg(lse, size_t(B) * NH * T, "attention_forward", "lse");
  const float* x = cpu::f32_arg(qkv, s.tokens() * 3 * C, "attention_forward", "qkv");
  const int HS = s.HS;
#pragma omp parallel
  {
    std::vector<float> scores(T);  // this thread's row of scaled scores
#pragma omp for collapse(3) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        for (int t = 0; t < T; t++) {
          const float* q = x + s.qkv_at(b, t, h);
          float mx = -INFINITY;
          for (int j = 0; j <= t; j++) {
            scores[j] = s.scale * dot(q, x + s.qkv_at(b, j, h) + C, HS);
            mx = std::max(mx, scores[j]);
          }
          float sum = 0.0f;
          for (int j = 0; j <= t; j++) {
            scores[j] = std::exp(scores[j] - mx);
            sum += scores[j];
          }
          float inv = 1.0f / sum;
          float* orow = o + s.out_at(b, t, h);
          for (int c = 0; c < HS; c++) orow[c] = 0.0f;
          for (int j = 0; j <= t; j++) axpy(orow, scores[j] * inv, x + s.qkv_at(b, j, h) + 2 * C, HS);
          l[s.lse_at(b, h, t)] = mx + std::log(sum);
        }
      }
    }
  }
}

void CpuOps::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int C,
                                int NH) {
  AttentionShape s("attention_backward", B, T, C, NH);
  float* dx = cpu::optional_f32_arg(dqkv, s.tokens() * 3 * C, "attention_backward", "dqkv");
  if (!dx) return;
  const float* dy = cpu::f32_arg(dout, s.tokens() * C, "attention_backward", "dout");
  const float* x = cpu::f32_arg(qkv, s.tokens() * 3 * C, "attention_backward", "qkv");
  const float* y = cpu::f32_arg(out, s.tokens() * C, "attention_backward", "out");
  const float* l = cpu::f32_arg(lse, size_t(B) * NH * T, "attention_backward", "lse");
  const int HS = s.HS;
#pragma omp parallel
  {
    // This thread's sums for one (b, h): dk and dv for every key, dq for the current query.
    // Summing apart and adding once keeps "+=" a single rounding per element.
    std::vector<float> dk(size_t(T) * HS), dv(size_t(T) * HS), dq(HS);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        std::fill(dk.begin(), dk.end(), 0.0f);
        std::fill(dv.begin(), dv.end(), 0.0f);
        for (int t = 0; t < T; t++) {
          const float* q = x + s.qkv_at(b, t, h);
          const float* dO = dy + s.out_at(b, t, h);
          float D = dot(dO, y + s.out_at(b, t, h), HS);
          float lse_t = l[s.lse_at(b, h, t)];
          std::fill(dq.begin(), dq.end(), 0.0f);
          for (int j = 0; j <= t; j++) {
            const float* k = x + s.qkv_at(b, j, h) + C;
            const float* v = k + C;
            float p = std::exp(s.scale * dot(q, k, HS) - lse_t);
            float dS = p * (dot(dO, v, HS) - D);
            axpy(dq.data(), dS, k, HS);
            axpy(dk.data() + size_t(j) * HS, s.scale * dS, q, HS);
            axpy(dv.data() + size_t(j) * HS, p, dO, HS);
          }
          axpy(dx + s.qkv_at(b, t, h), s.scale, dq.data(), HS);
        }
        for (int j = 0; j < T; j++) {
          float* dkv = dx + s.qkv_at(b, j, h) + C;
          axpy(dkv, 1.0f, dk.data() + size_t(j) * HS, HS);
          axpy(dkv + C, 1.0f, dv.data() + size_t(j) * HS, HS);
        }
      }
    }
  }
}

}  // namespace pt
