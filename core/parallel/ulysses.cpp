#include "core/parallel/ulysses.h"

#include <string>

namespace pt {

UlyssesAttention::UlyssesAttention(Ops& ops, Comm& cp, int B, int T_local, int C, int NH, DType dtype)
    : ops_(ops), cp_(cp), B_(B), T_local_(T_local), C_(C), NH_(NH), P_(cp.size()) {
  check(B > 0 && T_local > 0, "Ulysses attention: B and the local sequence length must be positive");
  check(NH > 0 && C % NH == 0,
        "Ulysses attention: n_heads=" + std::to_string(NH) + " must divide C=" + std::to_string(C));
  check(NH % P_ == 0, "Ulysses attention: this rank's " + std::to_string(NH) + " heads cannot be split over cp=" +
                          std::to_string(P_) + " ranks (n_heads must be divisible by tp*cp)");
  T_ = T_local * P_;
  Cd_ = C / P_;
  act_ = size_t(B) * T_local * C;
  send_ = ops.alloc(3 * act_, dtype);
  recv_ = ops.alloc(3 * act_, dtype);
  qkv_h_ = ops.alloc(3 * act_, dtype);
  out_h_ = ops.alloc(act_, dtype);
  dout_h_ = ops.alloc(act_, dtype);
  dqkv_h_ = ops.alloc(3 * act_, dtype);
}

UlyssesAttention::~UlyssesAttention() {
  for (Tensor* t : {&send_, &recv_, &qkv_h_, &out_h_, &dout_h_, &dqkv_h_})
    if (*t) ops_.release(*t);
}

void UlyssesAttention::seq_to_heads(Tensor heads, Tensor seq, int parts) {
  const size_t rows = size_t(B_) * T_local_;  // local tokens
  const size_t blk = rows * parts * Cd_;      // one rank's share: [B, T_local, parts, Cd]
  const size_t w = size_t(parts) * C_, wd = size_t(parts) * Cd_;
  // Block d of the send buffer: rank d's heads of every local token.
  for (int d = 0; d < P_; d++)
    for (int j = 0; j < parts; j++)
      ops_.copy_2d(send_.slice(d * blk + j * Cd_, blk - j * Cd_), wd,
                   seq.slice(j * C_ + d * Cd_, rows * w - j * C_ - d * Cd_), w, rows, Cd_);
  cp_.all_to_all(send_.slice(0, P_ * blk), recv_.slice(0, P_ * blk));
  // Block s of the receive buffer: rank s's tokens (positions s*T_local..) of this rank's heads.
  const size_t run = size_t(T_local_) * wd;  // one batch row of one block, contiguous on both sides
  for (int s = 0; s < P_; s++)
    ops_.copy_2d(heads.slice(s * run, size_t(B_) * T_ * wd - s * run), size_t(T_) * wd, recv_.slice(s * blk, blk), run,
                 B_, run);
}

void UlyssesAttention::heads_to_seq(Tensor seq, Tensor heads, int parts) {
  const size_t rows = size_t(B_) * T_local_;
  const size_t blk = rows * parts * Cd_;
  const size_t w = size_t(parts) * C_, wd = size_t(parts) * Cd_;
  const size_t run = size_t(T_local_) * wd;
  // Block d of the send buffer: rank d's tokens of this rank's heads.
  for (int d = 0; d < P_; d++)
    ops_.copy_2d(send_.slice(d * blk, blk), run, heads.slice(d * run, size_t(B_) * T_ * wd - d * run), size_t(T_) * wd,
                 B_, run);
  cp_.all_to_all(send_.slice(0, P_ * blk), recv_.slice(0, P_ * blk));
  // Block s: rank s's heads of the local tokens, into their channels.
  for (int s = 0; s < P_; s++)
    for (int j = 0; j < parts; j++)
      ops_.copy_2d(seq.slice(j * C_ + s * Cd_, rows * w - j * C_ - s * Cd_), w,
                   recv_.slice(s * blk + j * Cd_, blk - j * Cd_), wd, rows, Cd_);
}

void UlyssesAttention::forward(Tensor out, Tensor lse, Tensor qkv) {
  seq_to_heads(qkv_h_, qkv, 3);
  ops_.attention_forward(out_h_, lse, qkv_h_, B_, T_, Cd_, NH_ / P_);
  heads_to_seq(out, out_h_, 1);
}

void UlyssesAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) {
  if (!dqkv) return;
  seq_to_heads(qkv_h_, qkv, 3);
  seq_to_heads(out_h_, out, 1);
  seq_to_heads(dout_h_, dout, 1);
  ops_.attention_backward(dqkv_h_, dout_h_, qkv_h_, out_h_, lse, B_, T_, Cd_, NH_ / P_);
  heads_to_seq(dqkv, dqkv_h_, 3);  // writes every element: dqkv is overwritten
}

}  // namespace pt
