// FP8 attention on the CPU: the emulation of CudaOps' FP8 flash forward, step for step as
// core/common/fp8_attention.h defines it (per-(sequence, head) power-of-two scales, e4m3 codes by
// fp8_encode, scores from the codes' fp32 dot, the running max per 64-key tile, P cast to e4m3
// after scaling by 2^8), and its backward: the reference attention backward on the dequantised
// q, k, v with the forward's out and lse.
// Cost: the cast reads qkv twice (amax, then codes); the forward is the reference attention's
// 2*B*NH*T^2*HS FLOPs (causal) plus one encode and decode per probability; the backward adds a
// dequantised copy of qkv (B*T*(NH + 2 NKV)*HS floats) to the reference backward.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/common/fp8_attention.h"
#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_attention_kernels.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

namespace {

// A packed qkv in FP8: every value's code value (fp8_decode(fp8_encode(x * s)), unscaled) in
// qkv's layout, and each (b, head)'s scale_inv, heads numbered as in a row (q heads, k heads,
// v heads).
struct Fp8Heads {
  std::vector<float> codes;
  std::vector<float> scale_inv;  // [B, NH + 2 NKV]
  int heads = 0;
  float inv(int b, int head) const { return scale_inv[size_t(b) * heads + head]; }
};

Fp8Heads quantize_heads(const cpu::PackedAttention& a, const float* x) {
  const int B = a.p.B, T = a.p.Tq, HS = a.p.HS;
  const size_t W = a.width();
  Fp8Heads q;
  q.heads = a.p.NH + 2 * a.p.NKV;
  q.codes.resize(size_t(B) * T * W);
  q.scale_inv.resize(size_t(B) * q.heads);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int head = 0; head < q.heads; head++) {
      const size_t base = size_t(b) * T * W + size_t(head) * HS;
      uint32_t largest = 0;  // magnitude bits: an exact, order-free max (fp8.h)
      for (int t = 0; t < T; t++)
        for (int c = 0; c < HS; c++) largest = std::max(largest, fp8_magnitude_bits(x[base + t * W + c]));
      const int k = fp8_scale_exponent(fp8_bits_float(largest), kFp8AttnFormat);
      const float s = fp8_pow2(k);
      q.scale_inv[size_t(b) * q.heads + head] = fp8_pow2(-k);
      for (int t = 0; t < T; t++)
        for (int c = 0; c < HS; c++) {
          const size_t i = base + t * W + c;
          q.codes[i] = fp8_decode(fp8_encode(x[i] * s, kFp8AttnFormat), kFp8AttnFormat);
        }
    }
  }
  return q;
}

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

}  // namespace

bool CpuOps::supports_fp8_attention(int) const { return true; }

void CpuOps::attention_fp8_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) {
  const char* op = "attention_fp8_forward";
  const cpu::PackedAttention a(op, B, T, C, NH, NKV);
  const size_t BT = size_t(B) * T;
  float* o = cpu::f32_arg(out, BT * C, op, "out");
  float* l = cpu::f32_arg(lse, size_t(B) * NH * T, op, "lse");
  const float* x = cpu::f32_arg(qkv, BT * a.width(), op, "qkv");
  const Fp8Heads q8 = quantize_heads(a, x);
  const int HS = a.p.HS;
  const float scale_log2 = fp8_attn_scale_log2(HS);
  const cpu::AttentionRows qr = a.part(const_cast<float*>(q8.codes.data()), 0),
                           kr = a.part(const_cast<float*>(q8.codes.data()), 1),
                           vr = a.part(const_cast<float*>(q8.codes.data()), 2), orow = a.plain(o);
#pragma omp parallel
  {
    std::vector<float> xs(kFp8AttnKeyTile), acc(HS);
#pragma omp for collapse(3) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        for (int t = 0; t < T; t++) {
          const int g = a.p.kv_head(h);
          const float c = (q8.inv(b, h) * q8.inv(b, NH + g)) * scale_log2;
          const float* qt = qr.at(b, t, h, HS);
          float m = -INFINITY, sum = 0.0f;
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int j0 = 0; j0 <= t; j0 += kFp8AttnKeyTile) {
            const int n = std::min(kFp8AttnKeyTile, t + 1 - j0);  // the tile's visible keys
            float mx = -INFINITY;
            for (int j = 0; j < n; j++) {
              xs[j] = c * dot(qt, kr.at(b, j0 + j, g, HS), HS);
              mx = std::max(mx, xs[j]);
            }
            const float m_new = std::max(m, mx);
            const float alpha = m == -INFINITY ? 0.0f : std::exp2(m - m_new);
            float tile_sum = 0.0f;
            for (int i = 0; i < HS; i++) acc[i] *= alpha;
            for (int j = 0; j < n; j++) {
              const float p = std::exp2(xs[j] - m_new);
              tile_sum += p;
              const float pv = fp8_decode(fp8_encode(p * kFp8AttnPScale, kFp8AttnFormat), kFp8AttnFormat);
              const float* vj = vr.at(b, j0 + j, g, HS);
              for (int i = 0; i < HS; i++) acc[i] += pv * vj[i];
            }
            sum = sum * alpha + tile_sum;
            m = m_new;
          }
          const float out_scale = q8.inv(b, NH + NKV + g) / kFp8AttnPScale / sum;
          float* ot = orow.at(b, t, h, HS);
          for (int i = 0; i < HS; i++) ot[i] = acc[i] * out_scale;
          l[a.p.lse_at(b, h, t)] = (m + std::log2(sum)) * 0.6931471805599453f;
        }
      }
    }
  }
}

void CpuOps::attention_fp8_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int C,
                                    int NH, int NKV) {
  const char* op = "attention_fp8_backward";
  const cpu::PackedAttention a(op, B, T, C, NH, NKV);
  if (!dqkv) return;
  const size_t n = size_t(B) * T * a.width();
  const float* x = cpu::f32_arg(qkv, n, op, "qkv");
  // The values the forward multiplied: each code times its (b, head)'s scale_inv.
  Fp8Heads q8 = quantize_heads(a, x);
  const int HS = a.p.HS;
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < static_cast<long long>(n); i++) {
    const size_t row = size_t(i) / a.width();
    const int head = static_cast<int>(size_t(i) % a.width()) / HS;
    q8.codes[i] *= q8.inv(static_cast<int>(row / T), head);
  }
  attention_backward(dqkv, dout, Tensor{q8.codes.data(), n, DType::f32}, out, lse, B, T, C, NH, NKV);
}

}  // namespace pt
