// The attention a rank runs on heads it holds whole (no cp, or Ulysses after its all-to-all): in
// the compute dtype (Ops::attention_forward/backward) or in FP8 (precision.fp8_layers names
// attention: Ops::attention_fp8_forward/backward, core/common/fp8_attention.h). One switch, so
// CpAttention and UlyssesAttention make the same call whatever the precision.
#pragma once
#include "core/ops/ops.h"

namespace pt {

enum class AttentionPrecision { compute, fp8 };

inline void local_attention_forward(Ops& ops, AttentionPrecision prec, Tensor out, Tensor lse, Tensor qkv, int B, int T,
                                    int C, int NH, int NKV) {
  if (prec == AttentionPrecision::fp8)
    ops.attention_fp8_forward(out, lse, qkv, B, T, C, NH, NKV);
  else
    ops.attention_forward(out, lse, qkv, B, T, C, NH, NKV);
}

inline void local_attention_backward(Ops& ops, AttentionPrecision prec, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out,
                                     Tensor lse, int B, int T, int C, int NH, int NKV) {
  if (prec == AttentionPrecision::fp8)
    ops.attention_fp8_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV);
  else
    ops.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV);
}

}  // namespace pt
