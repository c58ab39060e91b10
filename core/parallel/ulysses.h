// Ulysses (DeepSpeed-Ulysses) context parallelism: attention over a sequence split across a
// context-parallel group of cp ranks in contiguous order (zigzag.h, CpSplitKind::contiguous:
// rank r holds tokens [r*T_local, (r+1)*T_local)). One all-to-all turns the sequence-sharded
// qkv [B, T_local, C + 2 Ckv] (every head, a slice of the tokens; Ckv = NKV * HS) into a
// head-sharded one [B, T, (C + 2 Ckv)/cp] (every token, query heads [r*NH/cp, (r+1)*NH/cp) and
// key/value heads [r*NKV/cp, (r+1)*NKV/cp)); the ordinary attention op runs on that; a second
// all-to-all turns the output back. Needs NH % cp == 0 and NKV % cp == 0 (in a model, this
// rank's heads after the tensor-parallel split: n_heads and n_kv_heads divisible by tp*cp).
// With grouped-query attention (NKV < NH) a rank's query heads h read key/value heads
// h / (NH/NKV), which are exactly the key/value heads it received: no K/V head is repeated.
//
// Communication per layer, per rank, in units of B*T_local*C*(cp-1)/cp activations (r = NKV/NH):
// forward 1 + 2r + 1 (qkv out, attention output back); backward 1 + 2r + 1 + 1 (qkv, out and
// dout regathered) + 1 + 2r (dqkv back). Unlike ring attention the volume does not grow with
// cp, but cp is capped by the key/value head count. Work is balanced without zigzag: every rank
// attends the whole causal sequence for its heads.
#pragma once
#include <vector>

#include "core/dist/comm.h"
#include "core/ops/ops.h"
#include "core/parallel/local_attention.h"

namespace pt {

class UlyssesAttention {
 public:
  // Local shapes: B rows of T_local tokens, C channels, NH query and NKV key/value heads (this
  // rank's, after any TP split); NH % cp.size() == 0 (else RuntimeError) and NKV % cp.size() == 0
  // (else ConfigError naming the rule). Allocates scratch_bytes() on ops. `prec`: the attention
  // the heads run once gathered (local_attention.h).
  UlyssesAttention(Ops& ops, Comm& cp, int B, int T_local, int C, int NH, int NKV, DType dtype,
                   AttentionPrecision prec = AttentionPrecision::compute);
  ~UlyssesAttention();
  UlyssesAttention(const UlyssesAttention&) = delete;
  UlyssesAttention& operator=(const UlyssesAttention&) = delete;

  // The tensors of Ops::attention_forward/backward on the local tokens: qkv [B, T_local, C + 2 Ckv],
  // out [B, T_local, C]; lse holds B*NH*T_local f32 like attention_forward's, but in the
  // head-sharded layout [B, NH/cp, T] (pass forward's to backward; it is not per local token).
  void forward(Tensor out, Tensor lse, Tensor qkv);
  // dqkv = the gradient of forward's out (overwritten).
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse);

  // Bytes of scratch the constructor allocates: 4 packed qkv-sized buffers of B*T_local*(C + 2 Ckv)
  // and 2 of B*T_local*C activations (14 B*T_local*C without GQA).
  static size_t scratch_bytes(int B, int T_local, int C, int NH, int NKV, DType dtype);

  // What a row of the tensors the all-to-alls move holds: q | k | v (C + 2 Ckv channels, each
  // part split by heads on its own), or C channels of NH heads (out, dout).
  enum class Rows { qkv, channels };
  // The all-to-alls by themselves: seq [B, T_local, width] (all heads) <-> heads
  // [B, T, width/cp] (this rank's heads of each part, parts in order).
  void seq_to_heads(Tensor heads, Tensor seq, Rows kind);
  void heads_to_seq(Tensor seq, Tensor heads, Rows kind);

 private:
  std::vector<int> part_widths(Rows kind) const;  // the channels of each part of a row

  Ops& ops_;
  Comm& cp_;
  int B_, T_local_, T_, C_, NH_, NKV_, P_, Cd_, Ckv_;
  AttentionPrecision prec_;
  size_t act_;  // B * T_local * C
  Tensor send_, recv_, qkv_h_, out_h_, dout_h_, dqkv_h_;
};

}  // namespace pt
