// FP8 attention (precision.fp8_layers names `attention`): the forward of causal self-attention
// with q, k, v and the probabilities P in e4m3, in the arrangement of FlashAttention-3's FP8
// forward. This header is the algorithm's one definition: CpuOps emulates it (core/cpu/
// cpu_attention_fp8.cpp) and CudaOps' kernel runs it (cuda/flash_attention_fp8.cu), with the
// constants and the V layout below shared, so the two agree up to the order of fp32 sums (and
// exp2's last bit, which can move a probability's code by one where it sits on a rounding tie).
//
// Scales, dynamic, whatever precision.fp8's recipe: one power-of-two scale per (sequence b,
// head) for each query head of q and each key/value head of k and of v, from that head's largest
// magnitude over the sequence's T x HS values (fp8_scale_exponent, e4m3):
//   code = fp8_encode(x * s, e4m3),  s_inv = 1 / s.
// Every layout holds a sequence's heads whole (tp splits heads, Ulysses gathers the sequence for
// a subset of heads, dp and pp split nothing of a head), so each quantises exactly as one rank
// does. Ring attention splits a sequence's keys over ranks and merges partial softmaxes, which
// quantise P under different running maxima: FP8 attention is refused there.
//
// Forward, per (b, query head h, key/value head g = h / (NH / NKV)) and query row t, keys j <= t
// visited in tiles of kFp8AttnKeyTile from key 0 (the GPU kernel's key tile: P's codes depend on
// the running max at the tile that holds the key):
//   c   = (sq_inv * sk_inv) * (log2(e) / sqrt(HS))              (f32; exact: powers of two)
//   x_j = c * dot(qcode_t, kcode_j)       (the dot in fp32: each product of two e4m3 is exact)
//   m = -inf, l = 0, acc = 0 (HS floats); for each tile J:
//     m'    = max(m, max_{j in J, j <= t} x_j)
//     alpha = exp2(m - m')  (0 while m = -inf)
//     p_j   = exp2(x_j - m')                         for j in J, j <= t (masked keys: none)
//     l     = l * alpha + sum_j p_j                  (the unquantised probabilities)
//     acc   = acc * alpha + sum_j pv_j * vcode_j     pv_j = fp8_decode(fp8_encode(p_j * kFp8AttnPScale))
//     m     = m'
//   out_t = acc * (sv_inv / kFp8AttnPScale) / l    (rounded to the compute dtype)
//   lse_t = (m + log2(l)) * ln(2)                  (the log-sum-exp of the dequantised scores)
// P is scaled by 2^8 before its cast (exact) so that small probabilities keep e4m3's normal
// range (down to 2^-14 relative to the row's max instead of 2^-6); p <= 1, so 256 never saturates.
// l sums P before quantisation, so lse is exactly the log-sum-exp of the dequantised scores and
// the backward's recomputed P (below) is the forward's before rounding.
//
// Backward: the compute dtype's attention backward (Ops::attention_backward) on the dequantised
// q, k, v (fp8_decode(code) * s_inv: exact in bf16 and f32) with the forward's out and lse: the
// gradient of attention on quantised inputs, passed straight through the quantisation of q, k,
// v and P (the straight-through estimator; FlashAttention-3 has no FP8 backward).
//
// Cost against bf16: the forward's two products at the FP8 tensor-core rate (2x bf16's on
// Hopper), plus a cast pass (read q, k, v once in bf16, write them once in e4m3); the backward
// as bf16's plus a dequantising pass.
#pragma once
#include <cmath>

#include "core/common/fp8.h"

namespace pt {

constexpr int kFp8AttnKeyTile = 64;          // keys per tile of the running max
constexpr float kFp8AttnPScale = 256.0f;     // P's scale before its cast (2^8)
constexpr Fp8Format kFp8AttnFormat = Fp8Format::e4m3;

// log2(e) / sqrt(HS), the score scale in the base-2 domain (c above is it times sq_inv * sk_inv),
// computed on the host alike for both backends.
inline float fp8_attn_scale_log2(int HS) { return 1.4426950408889634f / std::sqrt(static_cast<float>(HS)); }

// The CUDA kernel's layout of V's codes: transposed, [B, NKV, HS, Tpad] with Tpad = T rounded up
// to kFp8AttnKeyTile (zero codes past T), and within each aligned group of 16 keys the key at
// offset k stored at position fp8_attn_v_position(k). The P.V product (mma m16n8k32 with e4m3
// operands) takes P straight from the score accumulators of its thread, which hold keys
// {2i, 2i+1, 2i+8, 2i+9} (i = lane % 4) of each 16; a product's sum over keys may take them in
// any order as long as P and V agree, so V is stored in that order instead of moving P.
// Position 4i + e holds key 2i + (e & 1) + 8 (e >> 1); key k sits at the inverse below.
PT_FP8_FN int fp8_attn_v_position(int k) {
  const int base = k & ~15, r = k & 15;
  return base + 4 * ((r & 7) >> 1) + (r & 1) + 2 * (r >> 3);
}

// Rounds T up to whole key tiles (the padded length of V's transposed codes).
PT_FP8_FN int fp8_attn_padded_keys(int T) { return (T + kFp8AttnKeyTile - 1) / kFp8AttnKeyTile * kFp8AttnKeyTile; }

}  // namespace pt
