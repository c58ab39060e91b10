// The loop nests of CpuOps attention, shared by the packed-qkv op (cpu_attention.cpp:
// attention_forward/backward, queries and keys the same T tokens) and the block op
// (cpu_attention_block.cpp: Tq queries against Tk keys held apart, a KV cache or another
// context-parallel rank's block). Internal to core/cpu.
//
// Operands are views with strides, so one kernel reads q | k | v interleaved in a packed qkv
// row (row stride (NH + 2 NKV) HS) as well as separate [B, T, heads * HS] tensors: head h of
// token (b, t) starts at p + b * batch + t * row + h * HS. lse is always [B, NH, Tq], contiguous.
//
// Grouped-query attention: NH query heads share NKV key/value heads (NKV divides NH), query
// head h reading key/value head h / (NH / NKV), as Hugging Face's Llama. q, out, dout and lse
// have NH heads; k, v, dk and dv have NKV. NKV == NH is multi-head attention, computed exactly
// as before GQA existed (the same operations in the same order).
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
  int B, Tq, Tk, NH, NKV, HS;
  int q_pos0, k_pos0;
  bool causal;
  float scale;  // 1/sqrt(HS)

  int group() const { return NH / NKV; }            // query heads per key/value head
  int kv_head(int h) const { return h / group(); }  // the key/value head query head h reads

  // How many keys (a prefix of [0, Tk)) query i sees.
  int visible_keys(int i) const {
    if (!causal) return Tk;
    const long long last = static_cast<long long>(q_pos0) + i - k_pos0;  // the last visible key index
    return static_cast<int>(std::clamp<long long>(last + 1, 0, Tk));
  }
  size_t lse_at(int b, int h, int i) const { return (size_t(b) * NH + h) * Tq + i; }
};

// The head size C / NH after checking the head counts: NH > 0 divides C, NKV > 0 divides NH.
// Throws RuntimeError naming the op and the rule.
int attention_head_size(const char* op, int C, int NH, int NKV);

// The problem and operand views of the packed ops (attention_forward/backward and their FP8
// twins, cpu_attention_fp8.cpp): q | k | v of token (b, t) in one row of width() = (NH + 2 NKV) HS.
struct PackedAttention {
  AttentionProblem p;
  // Checks the dimensions and head counts, naming `op`.
  PackedAttention(const char* op, int B, int T, int C, int NH, int NKV);
  size_t width() const { return (size_t(p.NH) + 2 * size_t(p.NKV)) * p.HS; }
  // The offset of part `part` (0 q, 1 k, 2 v) within a row.
  size_t part_offset(int part) const {
    const size_t offset[3] = {0, size_t(p.NH) * p.HS, (size_t(p.NH) + p.NKV) * p.HS};
    return offset[part];
  }
  // Part `part` of a packed [B, T, width()] buffer.
  AttentionRows part(float* x, int part) const {
    return {x ? x + part_offset(part) : nullptr, width(), size_t(p.Tq) * width()};
  }
  AttentionRows plain(float* x) const {
    const size_t C = size_t(p.NH) * p.HS;
    return {x, C, size_t(p.Tq) * C};
  }
};

// out (the attention output of each query) and lse [B, NH, Tq] are overwritten.
void attention_rows_forward(const AttentionProblem& p, AttentionRows out, float* lse, AttentionRows q, AttentionRows k,
                            AttentionRows v);

// Accumulates (+=) into dq, dk, dv (any may have a null p: not needed) from the FINAL out and lse
// of each query row: D = dout . out, P = exp(scale q.k - lse), dS = P (dout.v - D).
// Parallel over (b, key/value head): a pair owns that head's channels of dk and dv and its
// group's query heads' channels of dq, for all tokens, so dq, dk and dv may be parts of one
// packed buffer, and the result is bitwise independent of the thread count. dk and dv sum the
// group's query heads in head order into one per-thread accumulator, added to dk/dv once.
void attention_rows_backward(const AttentionProblem& p, AttentionRows dq, AttentionRows dk, AttentionRows dv,
                             AttentionRows dout, AttentionRows q, AttentionRows k, AttentionRows v, AttentionRows out,
                             const float* lse);

}  // namespace pt::cpu
