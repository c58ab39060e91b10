#include "core/parallel/ring_attention.h"

#include <string>
#include <utility>

namespace pt {

RingAttention::RingAttention(Ops& ops, Comm& cp, int B, int T_local, int C, int NH, int NKV, DType dtype)
    : ops_(ops),
      cp_(cp),
      B_(B),
      T_local_(T_local),
      Tc_(T_local / 2),
      C_(C),
      NH_(NH),
      NKV_(NKV),
      P_(cp.size()),
      r_(cp.rank()) {
  check(B > 0 && T_local > 0 && T_local % 2 == 0,
        "ring attention: each rank's sequence (" + std::to_string(T_local) + " tokens) must hold two zigzag chunks");
  check(NH > 0 && C % NH == 0, "ring attention: n_heads=" + std::to_string(NH) + " must divide C=" + std::to_string(C));
  check(NKV > 0 && NH % NKV == 0,
        "ring attention: n_kv_heads=" + std::to_string(NKV) + " must divide n_heads=" + std::to_string(NH));
  Ckv_ = NKV * (C / NH);
  act_ = size_t(B) * Tc_ * C;
  act_kv_ = size_t(B) * Tc_ * Ckv_;
  rows_ = size_t(B) * NH * Tc_;
  q_ = ops.alloc(2 * act_, dtype);
  out_ = ops.alloc(2 * act_, dtype);
  lse_ = ops.alloc(2 * rows_, DType::f32);
  part_out_ = ops.alloc(act_, dtype);
  part_lse_ = ops.alloc(rows_, DType::f32);
  for (Tensor& t : kv_) t = ops.alloc(4 * act_kv_, dtype);
  dout_ = ops.alloc(2 * act_, dtype);
  dq_ = ops.alloc(2 * act_, dtype);
  for (Tensor& t : dkv_) t = ops.alloc(4 * act_kv_, dtype);
}

size_t RingAttention::scratch_bytes(int B, int T_local, int C, int NH, int NKV, DType dtype) {
  const size_t Tc = T_local / 2, half = size_t(B) * Tc * C, half_kv = half / NH * NKV;
  const size_t lse_half = size_t(B) * NH * Tc;
  return (9 * half + 16 * half_kv) * dtype_size(dtype) + 3 * lse_half * sizeof(float);
}

RingAttention::~RingAttention() {
  for (Tensor* t :
       {&q_, &out_, &lse_, &part_out_, &part_lse_, &kv_[0], &kv_[1], &dout_, &dq_, &dkv_[0], &dkv_[1]})
    if (*t) ops_.release(*t);
}

int RingAttention::chunk_of(int rank, int h) const { return h == 0 ? rank : 2 * P_ - 1 - rank; }

void RingAttention::unpack(Tensor dst, Tensor src, int width, int col0, int cols, int h) {
  const size_t chunk = size_t(Tc_) * cols;
  for (int b = 0; b < B_; b++) {
    const size_t off = (size_t(b) * T_local_ + size_t(h) * Tc_) * width + col0;
    ops_.copy_2d(dst.slice(b * chunk, chunk), cols, src.slice(off, size_t(Tc_ - 1) * width + cols), width, Tc_, cols);
  }
}

void RingAttention::pack(Tensor dst, int width, int col0, int cols, int h, Tensor src) {
  const size_t chunk = size_t(Tc_) * cols;
  for (int b = 0; b < B_; b++) {
    const size_t off = (size_t(b) * T_local_ + size_t(h) * Tc_) * width + col0;
    ops_.copy_2d(dst.slice(off, size_t(Tc_ - 1) * width + cols), width, src.slice(b * chunk, chunk), cols, Tc_, cols);
  }
}

// lse [B, NH, T_local] <-> two halves [B, NH, Tc]: B*NH rows, each split in two.
void RingAttention::unpack_lse(Tensor dst, Tensor lse) {
  const size_t rows = size_t(B_) * NH_;
  for (int h = 0; h < 2; h++)
    ops_.copy_2d(lse_half(dst, h), Tc_, lse.slice(size_t(h) * Tc_, (rows - 1) * T_local_ + Tc_), T_local_, rows, Tc_);
}

void RingAttention::pack_lse(Tensor lse, Tensor src) {
  const size_t rows = size_t(B_) * NH_;
  for (int h = 0; h < 2; h++)
    ops_.copy_2d(lse.slice(size_t(h) * Tc_, (rows - 1) * T_local_ + Tc_), T_local_, lse_half(src, h), Tc_, rows, Tc_);
}

void RingAttention::ring_exchange(Tensor out, Tensor in) {
  const int next = (r_ + 1) % P_, prev = (r_ + P_ - 1) % P_;
  // Blocking point-to-point: if every rank sent first, each send could wait for a receive that
  // is never posted. Even ranks send first and odd ranks receive first, so every send meets a
  // posted receive or a rank that will post one after its own send completes (also for odd cp).
  if (r_ % 2 == 0) {
    cp_.send(out, next);
    cp_.recv(in, prev);
  } else {
    cp_.recv(in, prev);
    cp_.send(out, next);
  }
}

void RingAttention::unpack_qkv(Tensor qkv, int slot) {
  const int W = C_ + 2 * Ckv_;  // q | k | v
  for (int h = 0; h < 2; h++) {
    unpack(half(q_, h), qkv, W, 0, C_, h);
    unpack(kv_part(kv_[slot], h), qkv, W, C_, Ckv_, h);
    unpack(kv_part(kv_[slot], 2 + h), qkv, W, C_ + Ckv_, Ckv_, h);
  }
}

void RingAttention::forward(Tensor out, Tensor lse, Tensor qkv) {
  int cur = 0;
  unpack_qkv(qkv, cur);
  bool started[2] = {false, false};  // has query half h an (out, lse) yet?
  for (int s = 0; s < P_; s++) {
    const int src = (r_ - s + P_) % P_;  // whose K/V chunks kv_[cur] holds
    if (s + 1 < P_) ring_exchange(kv_[cur], kv_[1 - cur]);
    for (int hq = 0; hq < 2; hq++) {
      const int cq = chunk_of(r_, hq);
      for (int hk = 0; hk < 2; hk++) {
        const int ck = chunk_of(src, hk);
        if (ck > cq) continue;  // every key in the queries' future: nothing visible
        const Tensor k = kv_part(kv_[cur], hk), v = kv_part(kv_[cur], 2 + hk);
        // The first block of a query half writes its result directly; later ones are merged.
        const Tensor o = started[hq] ? part_out_ : half(out_, hq);
        const Tensor l = started[hq] ? part_lse_ : lse_half(lse_, hq);
        ops_.attention_block_forward(o, l, half(q_, hq), k, v, B_, Tc_, Tc_, C_, NH_, NKV_, cq * Tc_, ck * Tc_, true);
        if (started[hq]) ops_.merge_attention_partials(half(out_, hq), lse_half(lse_, hq), o, l, B_, Tc_, C_, NH_);
        started[hq] = true;
      }
    }
    cur = 1 - cur;
  }
  for (int h = 0; h < 2; h++) pack(out, C_, 0, C_, h, half(out_, h));
  pack_lse(lse, lse_);
}

void RingAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) {
  if (!dqkv) return;
  int cur = 0;
  unpack_qkv(qkv, cur);
  for (int h = 0; h < 2; h++) {
    unpack(half(out_, h), out, C_, 0, C_, h);
    unpack(half(dout_, h), dout, C_, 0, C_, h);
  }
  unpack_lse(lse_, lse);
  ops_.zero(dq_);
  ops_.zero(dkv_[cur]);
  for (int s = 0; s < P_; s++) {
    const int src = (r_ - s + P_) % P_;  // whose K/V chunks (and dK/dV sums) we hold
    for (int hq = 0; hq < 2; hq++) {
      const int cq = chunk_of(r_, hq);
      for (int hk = 0; hk < 2; hk++) {
        const int ck = chunk_of(src, hk);
        if (ck > cq) continue;
        ops_.attention_block_backward(half(dq_, hq), kv_part(dkv_[cur], hk), kv_part(dkv_[cur], 2 + hk),
                                      half(dout_, hq), half(q_, hq), kv_part(kv_[cur], hk), kv_part(kv_[cur], 2 + hk),
                                      half(out_, hq), lse_half(lse_, hq), B_, Tc_, Tc_, C_, NH_, NKV_, cq * Tc_,
                                      ck * Tc_, true);
      }
    }
    // Pass K/V on (not needed after the last step) and the dK/dV sums (the last hop brings every
    // rank's own chunks' sums home: after cp hops they are back where they started).
    if (P_ > 1) {
      if (s + 1 < P_) ring_exchange(kv_[cur], kv_[1 - cur]);
      ring_exchange(dkv_[cur], dkv_[1 - cur]);
      cur = 1 - cur;
    }
  }
  // dqkv = [dq | dk | dv], reassembled in the packed zigzag layout (every element written).
  const int W = C_ + 2 * Ckv_;
  for (int h = 0; h < 2; h++) {
    pack(dqkv, W, 0, C_, h, half(dq_, h));
    pack(dqkv, W, C_, Ckv_, h, kv_part(dkv_[cur], h));
    pack(dqkv, W, C_ + Ckv_, Ckv_, h, kv_part(dkv_[cur], 2 + h));
  }
}

}  // namespace pt
