#include "core/parallel/tensor_parallel.h"

#include <string>

namespace pt {

TensorParallel::TensorParallel(Ops& ops, Comm& tp, bool sequence_parallel)
    : ops_(ops), tp_(tp), sp_(sequence_parallel && tp.size() > 1) {}

TensorParallel::~TensorParallel() {
  for (Tensor& t : scratch_)
    if (t) ops_.release(t);
}

Tensor TensorParallel::scratch(Slot slot, size_t n, DType dtype) {
  Tensor& t = scratch_[slot];
  if (t.numel < n || t.dtype != dtype) {
    if (t) ops_.release(t);
    t = ops_.alloc(n, dtype);
  }
  return t.slice(0, n);
}

int TensorParallel::outer_rows(int N) const {
  if (!sp_) return N;
  check(N % tp_.size() == 0, "sequence parallel: the " + std::to_string(N) +
                                 " tokens of a micro-batch must divide evenly over tp=" + std::to_string(tp_.size()));
  return N / tp_.size();
}

void TensorParallel::gather_tokens(Tensor full, Tensor shard, int N, int C) {
  const size_t n = size_t(outer_rows(N)) * C;
  tp_.all_gather(shard.slice(0, n), full.slice(0, n * tp_.size()));
}

void TensorParallel::reduce_scatter_tokens(Tensor shard, Tensor full, int N, int C) {
  const size_t n = size_t(outer_rows(N)) * C;
  tp_.reduce_scatter(full.slice(0, n * tp_.size()), shard.slice(0, n));
}

void TensorParallel::column_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC_local) {
  Tensor x = inp;
  if (sp_) {
    x = scratch(kGathered, size_t(N) * IC, inp.dtype);
    gather_tokens(x, inp, N, IC);
  }
  ops_.matmul_forward(out, x, w, bias, N, IC, OC_local);
}

void TensorParallel::column_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N,
                                     int IC, int OC_local) {
  // dinp is overwritten (as matmul_backward does): each rank's share of the input gradient is
  // summed over the group straight into it.
  if (!sp_) {
    ops_.matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC_local);
    if (dinp && tp_.size() > 1) tp_.all_reduce(dinp.slice(0, size_t(N) * IC));
    return;
  }
  Tensor x = inp;
  if (dw) {  // the weight gradient needs every token's input again (not kept from forward)
    x = scratch(kGathered, size_t(N) * IC, inp.dtype);
    gather_tokens(x, inp, N, IC);
  }
  // The share covers every token; each rank keeps the sum over its own tokens' rows.
  const Tensor partial = dinp ? scratch(kPartial, size_t(N) * IC, dout.dtype) : Tensor{};
  ops_.matmul_backward(partial, dw, dbias, dout, x, w, N, IC, OC_local);
  if (dinp) reduce_scatter_tokens(dinp, partial, N, IC);
}

void TensorParallel::row_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC_local, int OC) {
  // The bias joins the sum once, from rank 0.
  const Tensor b = tp_.rank() == 0 ? bias : Tensor{};
  if (sp_) {
    Tensor partial = scratch(kPartial, size_t(N) * OC, inp.dtype);
    ops_.matmul_forward(partial, inp, w, b, N, IC_local, OC);
    reduce_scatter_tokens(out, partial, N, OC);
  } else {
    ops_.matmul_forward(out, inp, w, b, N, IC_local, OC);
    tp_.all_reduce(out.slice(0, size_t(N) * OC));
  }
}

void TensorParallel::row_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N,
                                  int IC_local, int OC) {
  Tensor dy = dout;
  if (sp_) {
    dy = scratch(kGathered, size_t(N) * OC, dout.dtype);
    gather_tokens(dy, dout, N, OC);
  }
  // dy is the full output gradient on every rank, so dbias comes out whole (and equal) on each.
  ops_.matmul_backward(dinp, dw, dbias, dy, inp, w, N, IC_local, OC);
}

}  // namespace pt
