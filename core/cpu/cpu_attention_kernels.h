// The loop nests of CpuOps attention, shared by the packed-qkv op (cpu_attention.cpp:
// attention_forward/backward, queries and keys the same T tokens) and the block op
// (cpu_attention_block.cpp: Tq queries against Tk keys held apart, a KV cache or another
// context-parallel rank's block). Internal to core/cpu.
//
// Operands are views with strides, so one kernel reads q | k | v interleaved in a packed qkv
// row (row stride 3C) as well as separate [B, T, C] tensors (row stride C): head h of token
// (b, t) starts at p + b * batch + t * row + h * HS. lse is always [B, NH, Tq], contiguous.
//
// Masking: query i sits at position q_pos0 + i, key j at k_pos0 + j; with `causal` a query
// sees the keys at positions <= its own, which is always a prefix [0, n) of the keys
// (visible_keys). A query that sees no key gets out = 0 and lse = -inf, and contributes no
// gradient (its lse = -inf row is skipped in backward).
#pragma once
#include <algorithm>
#include <cstddef>

namespace pt::cpu {

struct AttentionRows {
  float* p = nullptr;
  size_t row = 0;    // elements between consecutive tokens
  size_t batch = 0;  // elements between consecutive batch rows
  float* at(int b, int t, int h, int HS) const { return p + size_t(b) * batch + size_t(t) * row + size_t(h) * HS; }
};

struct AttentionProblem {
  int B, Tq, Tk, NH, HS;
  int q_pos0, k_pos0;
  bool causal;
  float scale;  // 1/sqrt(HS)

  // How many keys (a prefix of [0, Tk)) query i sees.
  int visible_keys(int i) const {
    if (!causal) return Tk;
    const long long last = static_cast<long long>(q_pos0) + i - k_pos0;  // the last visible key index
    return static_cast<int>(std::clamp<long long>(last + 1, 0, Tk));
  }
  size_t lse_at(int b, int h, int i) const { return (size_t(b) * NH + h) * Tq + i; }
};

// out (the attention output of each query) and lse [B, NH, Tq] are overwritten.
void attention_rows_forward(const AttentionProblem& p, AttentionRows out, float* lse, AttentionRows q, AttentionRows k,
                            AttentionRows v);

// Accumulates (+=) into dq, dk, dv (any may have a null p: not needed) from the FINAL out and lse
// of each query row: D = dout . out, P = exp(scale q.k - lse), dS = P (dout.v - D).
// Parallel over (b, h): a pair owns its head's channels of dq, dk and dv for all tokens, so
// dq, dk and dv may be parts of one packed buffer, and the result is bitwise independent of
// the thread count.
void attention_rows_backward(const AttentionProblem& p, AttentionRows dq, AttentionRows dk, AttentionRows dv,
                             AttentionRows dout, AttentionRows q, AttentionRows k, AttentionRows v, AttentionRows out,
                             const float* lse);

}  // namespace pt::cpu
