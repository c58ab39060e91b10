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
// [B, T_local, 3C], out [B, T_local, C], lse [B, NH, T_local], T_local = 2*Tc in zigzag order),
// so a Stage swaps one call for the other. C and NH are this rank's (after any tensor-parallel
// head split). The chunks are regrouped chunk-major internally with Ops::copy_2d so that every
// block call sees contiguous [B, Tc, C] tensors.
//
// Communication per layer: forward (cp-1) * 2 * B*T_local*C activations sent per rank, backward
// (cp-1) * 2 + cp * 2 such blocks (K/V, then dK/dV); blocking send/recv in an order that cannot
// deadlock (even ranks send first, odd ranks receive first), so it does not overlap compute yet.
// Precision: dK/dV accumulate in the activation dtype across the cp hops (cp roundings in bf16).
#pragma once
#include "core/dist/comm.h"
#include "core/ops/ops.h"

namespace pt {

class RingAttention {
 public:
  // Allocates the scratch for these shapes (about 12.5 * B*T_local*C activations plus lse rows)
  // on `ops` in `dtype` (the activations' dtype). T_local must be even (two zigzag chunks).
  RingAttention(Ops& ops, Comm& cp, int B, int T_local, int C, int NH, DType dtype);
  ~RingAttention();
  RingAttention(const RingAttention&) = delete;
  RingAttention& operator=(const RingAttention&) = delete;

  // out, lse <- causal attention of the local queries against the whole sequence's keys.
  void forward(Tensor out, Tensor lse, Tensor qkv);
  // dqkv = the gradient of forward's out, overwritten (its k and v parts hold every rank's
  // contribution to the local keys and values). out and lse are forward's.
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse);

 private:
  // Chunk-major views: half h (0 = chunk r, 1 = chunk 2cp-1-r) of a [2, B, Tc, C] buffer.
  Tensor half(Tensor t, int h) const { return t.slice(size_t(h) * act_, act_); }
  Tensor lse_half(Tensor t, int h) const { return t.slice(size_t(h) * rows_, rows_); }
  // The global chunk index of half h of rank `rank`'s tokens.
  int chunk_of(int rank, int h) const;
  // dst [B, Tc, C] <- columns [col0, col0 + C) of half h of packed [B, T_local, width] src, and back.
  void unpack(Tensor dst, Tensor src, int width, int col0, int h);
  void pack(Tensor dst, int width, int col0, int h, Tensor src);
  void unpack_lse(Tensor dst, Tensor lse);
  // This rank's query halves into q_ and its key/value halves into kv_[slot] (forward and backward).
  void unpack_qkv(Tensor qkv, int slot);
  void pack_lse(Tensor lse, Tensor src);
  // Sends `out` to the next rank and receives `in` from the previous one.
  void ring_exchange(Tensor out, Tensor in);

  Ops& ops_;
  Comm& cp_;
  int B_, T_local_, Tc_, C_, NH_, P_, r_;
  size_t act_;   // B * Tc * C: one chunk-major half
  size_t rows_;  // B * NH * Tc: one half of lse
  // [2 halves] each unless noted; kv buffers are [k half 0, k half 1, v half 0, v half 1].
  Tensor q_, out_, lse_, part_out_, part_lse_, kv_[2], dout_, dq_, dkv_[2];
};

}  // namespace pt
