// Megatron tensor-parallel linear layers, with or without sequence parallelism, over a tp group.
//
// Column-parallel (QKV, MLP up): each rank holds the rows [rank*OC/tp, ...) of W [OC, IC] (and
// of the bias) and computes its slice of the output features: no communication forward; the
// input gradient is a partial sum per rank, reduced in backward.
// Row-parallel (attention out, MLP down): each rank holds the columns [rank*IC/tp, ...) of W
// (as a contiguous [OC, IC/tp] matrix) and gets the matching input features (a column-parallel
// layer's output); the outputs are partial sums, reduced in forward. The bias is added once
// (by rank 0 before the reduction); its gradient is the full one on every rank.
//
// Without sequence parallelism the tensors outside the pair are replicated, [N, C] on every
// rank: forward all-reduces after row-parallel, backward all-reduces the input gradient of
// column-parallel (Megatron's f and g). With sequence parallelism (`sp`) they are sharded by
// token: a rank holds rows [rank*N/tp, (rank+1)*N/tp) of the N = B*T tokens flattened (any
// partition works for the token-wise LayerNorm, residual and dropout between the pairs; N must
// divide by tp). Then forward all-gathers the tokens before column-parallel and reduce-scatters
// after row-parallel, and backward does the reverse: reduce-scatter the column-parallel input
// gradient, all-gather the row-parallel output gradient. Same bytes as all-reduce (an
// all-reduce is a reduce-scatter + all-gather), 1/tp of the activation memory in the SP region.
// Under SP, replicated parameters used inside the SP region (LayerNorm weights) get gradients
// from their token shard only: the caller all-reduces those over tp.
//
// All reductions go through Comm (f32 sums). Scratch is grown on demand and reused. Each layer
// can run its products in FP8 (enable_fp8, and an FP8 site per call).
#pragma once
#include <functional>
#include <memory>

#include "core/dist/comm.h"
#include "core/ops/ops.h"
#include "core/parallel/fp8_linear.h"

namespace pt {

class TensorParallel {
 public:
  TensorParallel(Ops& ops, Comm& tp, bool sequence_parallel);
  ~TensorParallel();
  // Bytes of the communication buffers once a forward and a backward have run over N tokens of
  // C channels: under sequence parallel the partial sums before a reduce-scatter, [N, C], and the
  // gathered tokens, [N, C], in the activation dtype; none without it (the all-reduces work in
  // place) or on one rank. They grow on first use; the memory plan counts them.
  static size_t scratch_bytes(int tp, bool sequence_parallel, size_t N, size_t C, DType dtype) {
    if (tp <= 1 || !sequence_parallel) return 0;
    return 2 * N * C * dtype_size(dtype);
  }
  TensorParallel(const TensorParallel&) = delete;
  TensorParallel& operator=(const TensorParallel&) = delete;

  // Lets the layers below run their products in FP8 (core/parallel/fp8_linear.h) when a call
  // passes an Fp8Site that is on, with one scale per tensor or (rowwise) per operand row; cp:
  // the context-parallel group (nullptr: none), over which amaxes running over tokens are
  // gathered; delayed: delayed scaling's state (not owned; nullptr: dynamic scaling).
  void enable_fp8(Comm* cp, Fp8Format grad_format, bool rowwise = false, Fp8Delayed* delayed = nullptr);

  bool sequence_parallel() const { return sp_; }
  int ranks() const { return tp_.size(); }
  // Rows of a tensor outside the parallel pair: N / tp under SP, N otherwise.
  int outer_rows(int N) const;

  // out [N, OC_local] = inp @ w^T + bias, inp [outer_rows(N), IC] (all-gathered under SP),
  // w [OC_local, IC], bias [OC_local] or null.
  void column_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC_local, Fp8Site fp8 = {});
  // dw, dbias += this rank's; dinp [outer_rows(N), IC] = the input gradient summed over the
  // group (all-reduce, or reduce-scatter under SP; overwritten, as Ops::matmul_backward does).
  // Any gradient may be null.
  void column_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N, int IC,
                       int OC_local, Fp8Site fp8 = {});
  // The column-parallel layer (no bias) in chunks of `chunk_rows` rows, for a consumer that
  // turns each chunk's output into its gradient before the next chunk is computed (the LM head
  // and its cross-entropy: the whole [N, OC_local] output never exists). For each chunk of rows
  // [r0, r0 + n): out_chunk [n, OC_local] = x[r0, r0 + n) @ w^T, then visit(r0, n, out_chunk),
  // which may overwrite out_chunk with d(loss)/d(out); then, when dinp or dw is set, the chunk's
  // backward: dw += out_chunk^T @ x rows, and the input gradient of those rows. dinp
  // [outer_rows(N), IC] is overwritten with the input gradient summed over the group, as
  // column_backward's. out_chunk holds at least chunk_rows * OC_local elements. Under SP the
  // input is all-gathered once and the input gradient reduce-scattered once, after the last chunk.
  // In FP8 (fp8 on) each chunk's products are scaled by that chunk's amaxes (the whole output
  // gradient never exists at once), or under delayed scaling by the site's history.
  void column_chunked(Tensor out_chunk, Tensor dinp, Tensor dw, Tensor inp, Tensor w, int N, int IC, int OC_local,
                      int chunk_rows, Fp8Site fp8, const std::function<void(int r0, int n, Tensor out)>& visit);
  // out [outer_rows(N), OC] = sum over ranks of inp @ w^T, + bias; inp [N, IC_local],
  // w [OC, IC_local], bias [OC] (replicated) or null.
  void row_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC_local, int OC, Fp8Site fp8 = {});
  // dinp [N, IC_local] = (overwritten), dw, dbias += from dout [outer_rows(N), OC] (all-gathered
  // under SP).
  void row_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N, int IC_local,
                    int OC, Fp8Site fp8 = {});
  // The same for a layer whose input was inp = gelu(pre), pre [N, IC_local] (the column-parallel
  // layer's pre-activation, this rank's features): the input gradient comes out through the
  // GELU, dpre [N, IC_local] = gelu'(pre) * (dout @ w) (overwritten; Ops::matmul_backward_input_dgelu).
  void row_backward_dgelu(Tensor dpre, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, Tensor pre, int N,
                          int IC_local, int OC, Fp8Site fp8 = {});

  // The sequence-parallel collectives by themselves: full [N, C] <- every rank's shard
  // [N/tp, C]; shard [N/tp, C] <- this rank's rows of the sum over ranks of full [N, C].
  void gather_tokens(Tensor full, Tensor shard, int N, int C);
  void reduce_scatter_tokens(Tensor shard, Tensor full, int N, int C);

 private:
  enum Slot { kGathered, kPartial, kSlots };
  Tensor scratch(Slot slot, size_t n, DType dtype);
  // A tensor of N rows of `cols` as the layer multiplies it: `t` itself, or under SP every
  // rank's rows of it gathered into the kGathered slot.
  Tensor all_rows(Tensor t, int N, int cols);
  // One layer's product and its backward, in FP8 when `fp8` is on (x_split / dout_split: whether the
  // tensor's columns are this rank's share, for its FP8 scale), else through Ops' own.
  void product(Tensor out, Tensor x, bool x_split, Tensor w, Tensor bias, int N, int IC, int OC, Fp8Site fp8);
  void product_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, bool dout_split, Tensor x, bool x_split,
                        Tensor w, int N, int IC, int OC, Fp8Site fp8);
  Fp8Linear* need_fp8();

  Ops& ops_;
  Comm& tp_;
  bool sp_;
  Tensor scratch_[kSlots];
  std::unique_ptr<Fp8Linear> fp8_;  // null until enable_fp8
};

}  // namespace pt
