// Attention of Tq queries against Tk keys/values held in separate tensors (a KV cache, or
// another context-parallel rank's block), and the log-sum-exp merge of partial results.
//  block forward/backward: the loop nests of cpu_attention.cpp (cpu_attention_kernels.h) on
//    q, out [B, Tq, C] and k, v [B, Tk, NKV*HS] (grouped-query: query head h reads key/value
//    head h / (NH / NKV)) with position offsets: query i at q_pos0 + i, key j at k_pos0 + j,
//    causal or not. Backward takes the FINAL (merged) out and lse of each row, so per-block
//    backward calls summed over the blocks give the gradient of the whole attention; dk/dv sum
//    the group's query heads.
//  merge: per (b, h, t) row, lse = logaddexp(lse_acc, lse_part) and out_acc = the two outputs
//    weighted by exp(lse_x - lse) (each block's share of the softmax mass).
// FLOPs: forward 2*B*NH*HS per visible (query, key) pair twice (q.k, p*v), backward five such
// products (independent of NKV: every query head still meets every visible key); the merge is memory-bound (reads 2
// outs, writes 1: 3*B*T*C floats).
#include <algorithm>
#include <cmath>
#include <string>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_attention_kernels.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

namespace {

cpu::AttentionProblem block_problem(const char* op, int B, int Tq, int Tk, int C, int NH, int NKV, int q_pos0,
                                    int k_pos0, bool causal) {
  cpu::check_dims(op, {B, Tq, Tk, C});
  const int HS = cpu::attention_head_size(op, C, NH, NKV);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  return cpu::AttentionProblem{B, Tq, Tk, NH, NKV, HS, q_pos0, k_pos0, causal, scale};
}

// A [B, T, C] tensor as a strided view.
cpu::AttentionRows rows(float* x, int T, int C) { return {x, size_t(C), size_t(T) * C}; }

}  // namespace

void CpuOps::attention_block_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int Tq, int Tk, int C,
                                     int NH, int NKV, int q_pos0, int k_pos0, bool causal) {
  const char* op = "attention_block_forward";
  const cpu::AttentionProblem p = block_problem(op, B, Tq, Tk, C, NH, NKV, q_pos0, k_pos0, causal);
  const int CK = NKV * p.HS;  // key/value channels
  float* o = cpu::f32_arg(out, size_t(B) * Tq * C, op, "out");
  float* l = cpu::f32_arg(lse, size_t(B) * NH * Tq, op, "lse");
  float* qp = cpu::f32_arg(q, size_t(B) * Tq * C, op, "q");
  float* kp = cpu::f32_arg(k, size_t(B) * Tk * CK, op, "k");
  float* vp = cpu::f32_arg(v, size_t(B) * Tk * CK, op, "v");
  cpu::attention_rows_forward(p, rows(o, Tq, C), l, rows(qp, Tq, C), rows(kp, Tk, CK), rows(vp, Tk, CK));
}

void CpuOps::attention_block_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                                      Tensor out, Tensor lse, int B, int Tq, int Tk, int C, int NH, int NKV, int q_pos0,
                                      int k_pos0, bool causal) {
  const char* op = "attention_block_backward";
  const cpu::AttentionProblem p = block_problem(op, B, Tq, Tk, C, NH, NKV, q_pos0, k_pos0, causal);
  const int CK = NKV * p.HS;  // key/value channels
  float* dqp = cpu::optional_f32_arg(dq, size_t(B) * Tq * C, op, "dq");
  float* dkp = cpu::optional_f32_arg(dk, size_t(B) * Tk * CK, op, "dk");
  float* dvp = cpu::optional_f32_arg(dv, size_t(B) * Tk * CK, op, "dv");
  if (!dqp && !dkp && !dvp) return;
  float* dy = cpu::f32_arg(dout, size_t(B) * Tq * C, op, "dout");
  float* qp = cpu::f32_arg(q, size_t(B) * Tq * C, op, "q");
  float* kp = cpu::f32_arg(k, size_t(B) * Tk * CK, op, "k");
  float* vp = cpu::f32_arg(v, size_t(B) * Tk * CK, op, "v");
  float* y = cpu::f32_arg(out, size_t(B) * Tq * C, op, "out");
  const float* l = cpu::f32_arg(lse, size_t(B) * NH * Tq, op, "lse");
  cpu::attention_rows_backward(p, rows(dqp, Tq, C), rows(dkp, Tk, CK), rows(dvp, Tk, CK), rows(dy, Tq, C),
                               rows(qp, Tq, C), rows(kp, Tk, CK), rows(vp, Tk, CK), rows(y, Tq, C), l);
}

void CpuOps::merge_attention_partials(Tensor out_acc, Tensor lse_acc, Tensor out_part, Tensor lse_part, int B, int T,
                                      int C, int NH) {
  const char* op = "merge_attention_partials";
  cpu::check_dims(op, {B, T, C});
  check(NH > 0 && C % NH == 0, std::string("CpuOps::") + op + ": n_heads=" + std::to_string(NH) +
                                   " must be positive and divide C=" + std::to_string(C));
  const int HS = C / NH;
  float* oa = cpu::f32_arg(out_acc, size_t(B) * T * C, op, "out_acc");
  float* la = cpu::f32_arg(lse_acc, size_t(B) * NH * T, op, "lse_acc");
  const float* op_ = cpu::f32_arg(out_part, size_t(B) * T * C, op, "out_part");
  const float* lp = cpu::f32_arg(lse_part, size_t(B) * NH * T, op, "lse_part");
#pragma omp parallel for collapse(3) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++) {
        const size_t li = (size_t(b) * NH + h) * T + t;
        const float a = la[li], p = lp[li];
        const float m = std::max(a, p);
        if (m == -INFINITY) continue;                            // neither side saw a key: keep out 0, lse -inf
        const float wa = std::exp(a - m), wp = std::exp(p - m);  // exp(-inf) = 0: an empty side has no weight
        const float s = wa + wp;
        la[li] = m + std::log(s);
        const float ca = wa / s, cp = wp / s;
        float* o = oa + (size_t(b) * T + t) * C + size_t(h) * HS;
        const float* x = op_ + (size_t(b) * T + t) * C + size_t(h) * HS;
        for (int c = 0; c < HS; c++) o[c] = o[c] * ca + x[c] * cp;
      }
    }
  }
}

}  // namespace pt
