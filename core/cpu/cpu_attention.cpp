// Causal self-attention, GPT-2's multi-head and Llama's grouped-query: scale 1/sqrt(HS), query
// t attends to keys 0..t. qkv[B, T, (NH + 2 NKV) HS] holds q (NH heads) | k (NKV heads) |
// v (NKV heads) per token, head h at channels [h*HS, (h+1)*HS) of each part; query head h reads
// key/value head h / (NH / NKV) (NKV == NH: GPT-2's [B, T, 3C]).
//  forward:  per (b, h, t): s_j = scale * q_t.k_j (j <= t), lse_t = log sum_j exp(s_j),
//            out_t = sum_j exp(s_j - lse_t) v_j, written to out[b, t, h*HS : (h+1)*HS].
//  backward: the flash-attention recurrence, recomputing P from q, k and lse (nothing T x T is
//            kept between calls): D_t = dO_t.O_t, dP_tj = dO_t.v_j, dS_tj = P_tj (dP_tj - D_t),
//            dq_t += scale sum_j dS_tj k_j, dk_j += scale sum_t dS_tj q_t, dv_j += sum_t P_tj dO_t,
//            dk and dv summed over the query heads of the key/value head's group.
// FLOPs (causal, ~T^2/2 pairs per (b, h)): forward ~2*B*NH*T^2*HS (q.k and p*v),
// backward ~4*B*NH*T^2*HS (q.k, dO.v, dS*k, dS*q, P*dO: 5 products of 2 FLOPs per pair and
// channel over half the matrix). Bytes: qkv, out, dout, lse once each (K/V are NKV/NH of the
// query bytes under GQA); K and V rows are reused from cache across queries, so at GPT-2
// shapes it is compute-bound. Repeated K/V heads are never materialised.
// Parallel over (b, h, t) forward and over (b, key/value head) backward: a pair owns its
// key/value head's channels of dk/dv and its group's channels of dq for all of its tokens, so
// dk/dv accumulate race-free in a fixed order (the group's query heads in order).
//
// The loop nests are general (cpu_attention_kernels.h): Tq queries against Tk keys at any
// position offsets, operands given as strided views. The packed op here is the case
// Tq = Tk = T, offsets 0, causal, with q, k, v (and dq, dk, dv) read at row stride
// (NH + 2 NKV) HS from one buffer; the block op (cpu_attention_block.cpp) is the same kernels
// on separate tensors.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_attention_kernels.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

namespace cpu {

namespace {

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

int attention_head_size(const char* op, int C, int NH, int NKV) {
  check(NH > 0 && C % NH == 0, std::string("CpuOps::") + op + ": n_heads=" + std::to_string(NH) +
                                   " must be positive and divide C=" + std::to_string(C));
  check(NKV > 0 && NH % NKV == 0, std::string("CpuOps::") + op + ": n_kv_heads=" + std::to_string(NKV) +
                                      " must be positive and divide n_heads=" + std::to_string(NH));
  return C / NH;
}

PackedAttention::PackedAttention(const char* op, int B, int T, int C, int NH, int NKV) {
  check_dims(op, {B, T, C});
  const int HS = attention_head_size(op, C, NH, NKV);
  p = AttentionProblem{B, T, T, NH, NKV, HS, 0, 0, true, 1.0f / std::sqrt(static_cast<float>(HS))};
}

void attention_rows_forward(const AttentionProblem& p, AttentionRows out, float* lse, AttentionRows q, AttentionRows k,
                            AttentionRows v) {
  const int B = p.B, NH = p.NH, Tq = p.Tq, HS = p.HS;
#pragma omp parallel
  {
    std::vector<float> scores(p.Tk);  // this thread's row of scaled scores
#pragma omp for collapse(3) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        for (int t = 0; t < Tq; t++) {
          const float* qrow = q.at(b, t, h, HS);
          const int n = p.visible_keys(t);
          float* orow = out.at(b, t, h, HS);
          for (int c = 0; c < HS; c++) orow[c] = 0.0f;
          if (n == 0) {  // no key to attend to: an empty softmax
            lse[p.lse_at(b, h, t)] = -INFINITY;
            continue;
          }
          float mx = -INFINITY;
          const int kvh = p.kv_head(h);
          for (int j = 0; j < n; j++) {
            scores[j] = p.scale * dot(qrow, k.at(b, j, kvh, HS), HS);
            mx = std::max(mx, scores[j]);
          }
          float sum = 0.0f;
          for (int j = 0; j < n; j++) {
            scores[j] = std::exp(scores[j] - mx);
            sum += scores[j];
          }
          float inv = 1.0f / sum;
          for (int j = 0; j < n; j++) axpy(orow, scores[j] * inv, v.at(b, j, kvh, HS), HS);
          lse[p.lse_at(b, h, t)] = mx + std::log(sum);
        }
      }
    }
  }
}

void attention_rows_backward(const AttentionProblem& p, AttentionRows dq, AttentionRows dk, AttentionRows dv,
                             AttentionRows dout, AttentionRows q, AttentionRows k, AttentionRows v, AttentionRows out,
                             const float* lse) {
  if (!dq.p && !dk.p && !dv.p) return;
  const int B = p.B, NKV = p.NKV, G = p.group(), Tq = p.Tq, Tk = p.Tk, HS = p.HS;
#pragma omp parallel
  {
    // This thread's sums for one (b, key/value head): dk and dv for every key (over the whole
    // group of query heads), dq for the current query. Summing apart and adding once keeps "+="
    // a single rounding per element.
    std::vector<float> dk_acc(size_t(Tk) * HS), dv_acc(size_t(Tk) * HS), dq_acc(HS);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int g = 0; g < NKV; g++) {
        std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
        std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
        int keys_touched = 0;  // keys [0, keys_touched) got a contribution
        for (int h = g * G; h < (g + 1) * G; h++) {
          for (int t = 0; t < Tq; t++) {
            const float lse_t = lse[p.lse_at(b, h, t)];
            const int n = p.visible_keys(t);
            if (n == 0 || lse_t == -INFINITY) continue;  // a row that saw no key has no gradient
            keys_touched = std::max(keys_touched, n);
            const float* qrow = q.at(b, t, h, HS);
            const float* dO = dout.at(b, t, h, HS);
            float D = dot(dO, out.at(b, t, h, HS), HS);
            std::fill(dq_acc.begin(), dq_acc.end(), 0.0f);
            for (int j = 0; j < n; j++) {
              const float* krow = k.at(b, j, g, HS);
              const float* vrow = v.at(b, j, g, HS);
              float P = std::exp(p.scale * dot(qrow, krow, HS) - lse_t);
              float dS = P * (dot(dO, vrow, HS) - D);
              axpy(dq_acc.data(), dS, krow, HS);
              axpy(dk_acc.data() + size_t(j) * HS, p.scale * dS, qrow, HS);
              axpy(dv_acc.data() + size_t(j) * HS, P, dO, HS);
            }
            if (dq.p) axpy(dq.at(b, t, h, HS), p.scale, dq_acc.data(), HS);
          }
        }
        for (int j = 0; j < keys_touched; j++) {
          if (dk.p) axpy(dk.at(b, j, g, HS), 1.0f, dk_acc.data() + size_t(j) * HS, HS);
          if (dv.p) axpy(dv.at(b, j, g, HS), 1.0f, dv_acc.data() + size_t(j) * HS, HS);
        }
      }
    }
  }
}

}  // namespace cpu


void CpuOps::attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) {
  cpu::PackedAttention a("attention_forward", B, T, C, NH, NKV);
  const size_t BT = size_t(B) * T;
  float* o = cpu::f32_arg(out, BT * C, "attention_forward", "out");
  float* l = cpu::f32_arg(lse, size_t(B) * NH * T, "attention_forward", "lse");
  float* x = cpu::f32_arg(qkv, BT * a.width(), "attention_forward", "qkv");
  cpu::attention_rows_forward(a.p, a.plain(o), l, a.part(x, 0), a.part(x, 1), a.part(x, 2));
}

void CpuOps::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int C,
                                int NH, int NKV) {
  cpu::PackedAttention a("attention_backward", B, T, C, NH, NKV);
  const size_t BT = size_t(B) * T;
  float* dx = cpu::optional_f32_arg(dqkv, BT * a.width(), "attention_backward", "dqkv");
  if (!dx) return;
  float* dy = cpu::f32_arg(dout, BT * C, "attention_backward", "dout");
  float* x = cpu::f32_arg(qkv, BT * a.width(), "attention_backward", "qkv");
  float* y = cpu::f32_arg(out, BT * C, "attention_backward", "out");
  const float* l = cpu::f32_arg(lse, size_t(B) * NH * T, "attention_backward", "lse");
  // Overwritten (Ops): the rows kernel accumulates, as the blockwise op needs, so start it from
  // zeros; 0 + x == x, so the result is the same bits as accumulating into a zeroed buffer.
  std::fill(dx, dx + BT * a.width(), 0.0f);
  cpu::attention_rows_backward(a.p, a.part(dx, 0), a.part(dx, 1), a.part(dx, 2), a.plain(dy), a.part(x, 0),
                               a.part(x, 1), a.part(x, 2), a.plain(y), l);
}

}  // namespace pt
