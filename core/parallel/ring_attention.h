// Ring attention: causal self-attention over a sequence split across a context-parallel group
// of cp ranks in zigzag order (zigzag.h: rank r holds chunks r and 2cp-1-r, Tc tokens each).
//
// Forward: every rank keeps its queries and passes its K/V chunks around the ring (rank r sends
// to r+1 and receives from r-1), cp-1 times, so after cp steps each rank has seen every K/V
// chunk once. Each (query chunk, key chunk) pair is one Ops::attention_block_forward with the
// chunks' global positions as offsets; pairs whose keys all lie in the queries' future are
// skipped. With zigzag every rank computes the same work: 2 diagonal (causal) blocks at step 0
// and 2cp-1 full ones (1 at step 0, then 2 per step). The partial results of a query chunk are
// merged with Ops::merge_attention_partials (log-sum-exp weights).
// Backward: the same ring, now carrying each K/V chunk together with its dK/dV accumulator; each
// rank adds its queries' contribution (Ops::attention_block_backward from the FINAL out and lse)
// and passes both on; one last hop returns every dK/dV to its owner. dQ stays local.
//
// Tensors are those of Ops::attention_forward/backward on the rank's local tokens (qkv
// [B, T_local, (NH + 2 NKV) HS], out [B, T_local, C], lse [B, NH, T_local], T_local = 2*Tc in
// zigzag order), so a Stage swaps one call for the other. C, NH and NKV are this rank's (after
// any tensor-parallel head split). The chunks are regrouped chunk-major internally with
// Ops::copy_2d so that every block call sees contiguous [B, Tc, C] queries and [B, Tc, Ckv]
// keys/values (Ckv = NKV * HS).
//
// Grouped-query attention: only the NKV key/value heads travel the ring, never repeated to NH.
// Communication per layer: forward (cp-1) * 2 * B*T_local*Ckv activations sent per rank,
// backward (cp-1) * 2 + cp * 2 such blocks (K/V, then dK/dV): NKV/NH of multi-head attention's.
// Blocking send/recv in an order that cannot deadlock (even ranks send first, odd ranks receive
// first), so it does not overlap compute yet.
// Precision: dK/dV accumulate in the activation dtype across the cp hops (cp roundings in bf16).
#pragma once
#include "core/dist/comm.h"
#include "core/ops/ops.h"

namespace pt {

class RingAttention {
 public:
  // Allocates the scratch for these shapes (scratch_bytes) on `ops` in `dtype` (the activations'
  // dtype). T_local must be even (two zigzag chunks); NKV must divide NH.
  RingAttention(Ops& ops, Comm& cp, int B, int T_local, int C, int NH, int NKV, DType dtype);
  ~RingAttention();
  RingAttention(const RingAttention&) = delete;
  RingAttention& operator=(const RingAttention&) = delete;

  // out, lse <- causal attention of the local queries against the whole sequence's keys.
  void forward(Tensor out, Tensor lse, Tensor qkv);
  // dqkv = the gradient of forward's out, overwritten (its k and v parts hold every rank's
  // contribution to the local keys and values). out and lse are forward's.
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse);

  // Bytes of scratch the constructor allocates: 9 chunk-major halves of B*Tc*C (q, out, dout,
  // dq, one partial out), 16 of B*Tc*Ckv (two K/V and two dK/dV ring slots of 4 halves each) and
  // 3 halves of the lse rows.
  static size_t scratch_bytes(int B, int T_local, int C, int NH, int NKV, DType dtype);

 private:
  // Chunk-major views: half h (0 = chunk r, 1 = chunk 2cp-1-r) of a [2, B, Tc, C] buffer.
  Tensor half(Tensor t, int h) const { return t.slice(size_t(h) * act_, act_); }
  // Part i of a K/V ring slot [k half 0, k half 1, v half 0, v half 1], each [B, Tc, Ckv].
  Tensor kv_part(Tensor t, int i) const { return t.slice(size_t(i) * act_kv_, act_kv_); }
  Tensor lse_half(Tensor t, int h) const { return t.slice(size_t(h) * rows_, rows_); }
  // The global chunk index of half h of rank `rank`'s tokens.
  int chunk_of(int rank, int h) const;
  // dst [B, Tc, cols] <- columns [col0, col0 + cols) of half h of packed [B, T_local, width] src,
  // and back.
  void unpack(Tensor dst, Tensor src, int width, int col0, int cols, int h);
  void pack(Tensor dst, int width, int col0, int cols, int h, Tensor src);
  void unpack_lse(Tensor dst, Tensor lse);
  // This rank's query halves into q_ and its key/value halves into kv_[slot] (forward and backward).
  void unpack_qkv(Tensor qkv, int slot);
  void pack_lse(Tensor lse, Tensor src);
  // Sends `out` to the next rank and receives `in` from the previous one.
  void ring_exchange(Tensor out, Tensor in);

  Ops& ops_;
  Comm& cp_;
  int B_, T_local_, Tc_, C_, NH_, NKV_, Ckv_, P_, r_;
  size_t act_;     // B * Tc * C: one chunk-major half of queries
  size_t act_kv_;  // B * Tc * Ckv: one chunk-major half of keys or values
  size_t rows_;    // B * NH * Tc: one half of lse
  // [2 halves] each unless noted; kv buffers are [k half 0, k half 1, v half 0, v half 1] (kv_part).
  Tensor q_, out_, lse_, part_out_, part_lse_, kv_[2], dout_, dq_, dkv_[2];
};

}  // namespace pt
