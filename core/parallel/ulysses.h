// Ulysses (DeepSpeed-Ulysses) context parallelism: attention over a sequence split across a
// context-parallel group of cp ranks in contiguous order (zigzag.h, CpSplitKind::contiguous:
// rank r holds tokens [r*T_local, (r+1)*T_local)). One all-to-all turns the sequence-sharded
// qkv [B, T_local, 3C] (every head, a slice of the tokens) into a head-sharded one
// [B, T, 3C/cp] (every token, heads [r*NH/cp, (r+1)*NH/cp)); the ordinary attention op runs on
// that; a second all-to-all turns the output back. Needs NH % cp == 0 (in a model, this rank's
// heads after the tensor-parallel split: n_heads % (tp*cp) == 0).
//
// Communication per layer, per rank: forward 3 + 1 blocks of B*T_local*C*(cp-1)/cp activations
// (qkv out, attention output back); backward 3 + 1 + 1 (qkv, out and dout regathered) + 3 (dqkv
// back). Unlike ring attention the volume does not grow with cp, but cp is capped by the head
// count. Work is balanced without zigzag: every rank attends the whole causal sequence for its
// heads.
#pragma once
#include "core/dist/comm.h"
#include "core/ops/ops.h"

namespace pt {

class UlyssesAttention {
 public:
  // Local shapes: B rows of T_local tokens, C channels and NH heads (this rank's, after any TP
  // split); NH % cp.size() == 0. Allocates scratch (14 * B*T_local*C activations) on ops.
  UlyssesAttention(Ops& ops, Comm& cp, int B, int T_local, int C, int NH, DType dtype);
  ~UlyssesAttention();
  UlyssesAttention(const UlyssesAttention&) = delete;
  UlyssesAttention& operator=(const UlyssesAttention&) = delete;

  // The tensors of Ops::attention_forward/backward on the local tokens: qkv [B, T_local, 3C],
  // out [B, T_local, C]; lse holds B*NH*T_local f32 like attention_forward's, but in the
  // head-sharded layout [B, NH/cp, T] (pass forward's to backward; it is not per local token).
  void forward(Tensor out, Tensor lse, Tensor qkv);
  // dqkv = the gradient of forward's out (overwritten).
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse);

  // The all-to-alls by themselves, for `parts` interleaved [B, T, C]-shaped parts (3 for qkv):
  // seq [B, T_local, parts*C] (all heads) <-> heads [B, T, parts*C/cp] (this rank's heads).
  void seq_to_heads(Tensor heads, Tensor seq, int parts);
  void heads_to_seq(Tensor seq, Tensor heads, int parts);

 private:
  Ops& ops_;
  Comm& cp_;
  int B_, T_local_, T_, C_, NH_, P_, Cd_;
  size_t act_;  // B * T_local * C
  Tensor send_, recv_, qkv_h_, out_h_, dout_h_, dqkv_h_;
};

}  // namespace pt
