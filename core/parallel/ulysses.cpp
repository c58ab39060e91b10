#include "core/parallel/ulysses.h"

#include <string>

#include "core/common/error.h"

namespace pt {

namespace {

// B * T_local * (C + 2 Ckv): the packed qkv of the local tokens, the largest all-to-all.
size_t qkv_elems(int B, int T_local, int C, int NH, int NKV) {
  return size_t(B) * T_local * (size_t(C) + 2 * (size_t(C) / NH * NKV));
}

}  // namespace

UlyssesAttention::UlyssesAttention(Ops& ops, Comm& cp, int B, int T_local, int C, int NH, int NKV, DType dtype,
                                   AttentionPrecision prec)
    : ops_(ops), cp_(cp), B_(B), T_local_(T_local), C_(C), NH_(NH), NKV_(NKV), P_(cp.size()), prec_(prec) {
  check(B > 0 && T_local > 0, "Ulysses attention: B and the local sequence length must be positive");
  check(NH > 0 && C % NH == 0,
        "Ulysses attention: n_heads=" + std::to_string(NH) + " must divide C=" + std::to_string(C));
  check(NH % P_ == 0, "Ulysses attention: this rank's " + std::to_string(NH) + " heads cannot be split over cp=" +
                          std::to_string(P_) + " ranks (n_heads must be divisible by tp*cp)");
  check(NKV > 0 && NH % NKV == 0,
        "Ulysses attention: n_kv_heads=" + std::to_string(NKV) + " must divide n_heads=" + std::to_string(NH));
  // Each rank attends with whole key/value heads of its own (a query head's key/value head must
  // land on the same rank, and is never repeated): the key/value heads split over cp too. This
  // is a property of the model and layout the user chose, hence a ConfigError.
  if (NKV % P_ != 0)
    throw ConfigError("Ulysses attention: this rank's n_kv_heads=" + std::to_string(NKV) +
                      " cannot be split over cp=" + std::to_string(P_) +
                      " ranks (parallel.cp_impl=ulysses needs model.n_kv_heads divisible by tp*cp)");
  T_ = T_local * P_;
  Cd_ = C / P_;
  Ckv_ = C / NH * NKV;
  act_ = size_t(B) * T_local * C;
  const size_t qkv = qkv_elems(B, T_local, C, NH, NKV);
  send_ = ops.alloc(qkv, dtype);
  recv_ = ops.alloc(qkv, dtype);
  qkv_h_ = ops.alloc(qkv, dtype);
  out_h_ = ops.alloc(act_, dtype);
  dout_h_ = ops.alloc(act_, dtype);
  dqkv_h_ = ops.alloc(qkv, dtype);
}

UlyssesAttention::~UlyssesAttention() {
  for (Tensor* t : {&send_, &recv_, &qkv_h_, &out_h_, &dout_h_, &dqkv_h_})
    if (*t) ops_.release(*t);
}

size_t UlyssesAttention::scratch_bytes(int B, int T_local, int C, int NH, int NKV, DType dtype) {
  return (4 * qkv_elems(B, T_local, C, NH, NKV) + 2 * size_t(B) * T_local * C) * dtype_size(dtype);
}

std::vector<int> UlyssesAttention::part_widths(Rows rows) const {
  return rows == Rows::qkv ? std::vector<int>{C_, Ckv_, Ckv_} : std::vector<int>{C_};
}

void UlyssesAttention::seq_to_heads(Tensor heads, Tensor seq, Rows kind) {
  const std::vector<int> widths = part_widths(kind);
  size_t w = 0;
  for (int x : widths) w += x;
  const size_t wd = w / P_;                   // one rank's share of a token's channels
  const size_t rows = size_t(B_) * T_local_;  // local tokens
  const size_t blk = rows * wd;               // one rank's share: [B, T_local, wd]
  // Block d of the send buffer: rank d's heads of every local token, part by part.
  for (int d = 0; d < P_; d++) {
    size_t col = 0, cold = 0;  // the part's first channel in seq and in a block row
    for (int width : widths) {
      const size_t n = width / P_, src = col + d * n;
      ops_.copy_2d(send_.slice(d * blk + cold, blk - cold), wd, seq.slice(src, rows * w - src), w, rows, n);
      col += width;
      cold += n;
    }
  }
  cp_.all_to_all(send_.slice(0, P_ * blk), recv_.slice(0, P_ * blk));
  // Block s of the receive buffer: rank s's tokens (positions s*T_local..) of this rank's heads.
  const size_t run = size_t(T_local_) * wd;  // one batch row of one block, contiguous on both sides
  for (int s = 0; s < P_; s++)
    ops_.copy_2d(heads.slice(s * run, size_t(B_) * T_ * wd - s * run), size_t(T_) * wd, recv_.slice(s * blk, blk), run,
                 B_, run);
}

void UlyssesAttention::heads_to_seq(Tensor seq, Tensor heads, Rows kind) {
  const std::vector<int> widths = part_widths(kind);
  size_t w = 0;
  for (int x : widths) w += x;
  const size_t wd = w / P_;
  const size_t rows = size_t(B_) * T_local_;
  const size_t blk = rows * wd;
  const size_t run = size_t(T_local_) * wd;
  // Block d of the send buffer: rank d's tokens of this rank's heads.
  for (int d = 0; d < P_; d++)
    ops_.copy_2d(send_.slice(d * blk, blk), run, heads.slice(d * run, size_t(B_) * T_ * wd - d * run), size_t(T_) * wd,
                 B_, run);
  cp_.all_to_all(send_.slice(0, P_ * blk), recv_.slice(0, P_ * blk));
  // Block s: rank s's heads of the local tokens, into their channels, part by part.
  for (int s = 0; s < P_; s++) {
    size_t col = 0, cold = 0;
    for (int width : widths) {
      const size_t n = width / P_, dst = col + s * n;
      ops_.copy_2d(seq.slice(dst, rows * w - dst), w, recv_.slice(s * blk + cold, blk - cold), wd, rows, n);
      col += width;
      cold += n;
    }
  }
}

void UlyssesAttention::forward(Tensor out, Tensor lse, Tensor qkv) {
  seq_to_heads(qkv_h_, qkv, Rows::qkv);
  local_attention_forward(ops_, prec_, out_h_, lse, qkv_h_, B_, T_, Cd_, NH_ / P_, NKV_ / P_);
  heads_to_seq(out, out_h_, Rows::channels);
}

void UlyssesAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) {
  if (!dqkv) return;
  seq_to_heads(qkv_h_, qkv, Rows::qkv);
  seq_to_heads(out_h_, out, Rows::channels);
  seq_to_heads(dout_h_, dout, Rows::channels);
  local_attention_backward(ops_, prec_, dqkv_h_, dout_h_, qkv_h_, out_h_, lse, B_, T_, Cd_, NH_ / P_, NKV_ / P_);
  heads_to_seq(dqkv, dqkv_h_, Rows::qkv);  // writes every element: dqkv is overwritten
}

}  // namespace pt
