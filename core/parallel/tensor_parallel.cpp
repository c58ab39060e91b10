#include "core/parallel/tensor_parallel.h"

#include <algorithm>
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

Tensor TensorParallel::all_rows(Tensor t, int N, int cols) {
  if (!sp_) return t;
  const Tensor full = scratch(kGathered, size_t(N) * cols, t.dtype);
  gather_tokens(full, t, N, cols);
  return full;
}

void TensorParallel::enable_fp8(Comm* cp, Fp8Format grad_format, bool rowwise, Fp8Delayed* delayed) {
  fp8_ = std::make_unique<Fp8Linear>(ops_, tp_, cp, grad_format, rowwise);
  fp8_->set_delayed(delayed);
}

void TensorParallel::product(Tensor out, Tensor x, bool x_split, Tensor w, Tensor bias, int N, int IC, int OC,
                             Fp8Site fp8) {
  if (fp8.on()) need_fp8()->forward(out, x, x_split, w, bias, N, IC, OC, fp8);
  else ops_.matmul_forward(out, x, w, bias, N, IC, OC);
}

void TensorParallel::product_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, bool dout_split, Tensor x,
                                      bool x_split, Tensor w, int N, int IC, int OC, Fp8Site fp8) {
  if (fp8.on()) need_fp8()->backward(dinp, dw, dbias, dout, dout_split, x, x_split, w, N, IC, OC, fp8);
  else ops_.matmul_backward(dinp, dw, dbias, dout, x, w, N, IC, OC);
}

Fp8Linear* TensorParallel::need_fp8() {
  check(fp8_ != nullptr, "TensorParallel: an FP8 product was asked for before enable_fp8");
  return fp8_.get();
}

void TensorParallel::column_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC_local,
                                    Fp8Site fp8) {
  product(out, all_rows(inp, N, IC), /*x_split=*/false, w, bias, N, IC, OC_local, fp8);
}

void TensorParallel::column_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N,
                                     int IC, int OC_local, Fp8Site fp8) {
  // dinp is overwritten (as matmul_backward does): each rank's share of the input gradient is
  // summed over the group straight into it.
  if (!sp_) {
    product_backward(dinp, dw, dbias, dout, /*dout_split=*/true, inp, /*x_split=*/false, w, N, IC, OC_local, fp8);
    if (dinp && tp_.size() > 1) tp_.all_reduce(dinp.slice(0, size_t(N) * IC));
    return;
  }
  // The weight gradient needs every token's input again (not kept from forward).
  const Tensor x = dw ? all_rows(inp, N, IC) : inp;
  // The share covers every token; each rank keeps the sum over its own tokens' rows.
  const Tensor partial = dinp ? scratch(kPartial, size_t(N) * IC, dout.dtype) : Tensor{};
  product_backward(partial, dw, dbias, dout, /*dout_split=*/true, x, /*x_split=*/false, w, N, IC, OC_local, fp8);
  if (dinp) reduce_scatter_tokens(dinp, partial, N, IC);
}

void TensorParallel::column_chunked(Tensor out_chunk, Tensor dinp, Tensor dw, Tensor inp, Tensor w, int N, int IC,
                                    int OC_local, int chunk_rows, Fp8Site fp8,
                                    const std::function<void(int, int, Tensor)>& visit) {
  check(chunk_rows > 0, "TensorParallel::column_chunked: chunk_rows must be positive");
  const Tensor x = all_rows(inp, N, IC);
  // The input gradient of every token: this rank's share, summed over the group at the end
  // (straight into dinp without SP; under SP each rank keeps its own rows' sum).
  const Tensor dx = !dinp ? Tensor{} : sp_ ? scratch(kPartial, size_t(N) * IC, inp.dtype) : dinp;
  for (int r0 = 0; r0 < N; r0 += chunk_rows) {
    const int n = std::min(chunk_rows, N - r0);
    const Tensor out = out_chunk.slice(0, size_t(n) * OC_local);
    const Tensor xr = x.slice(size_t(r0) * IC, size_t(n) * IC);
    product(out, xr, /*x_split=*/false, w, Tensor{}, n, IC, OC_local, fp8);
    visit(r0, n, out);
    if (dx || dw)
      product_backward(dx ? dx.slice(size_t(r0) * IC, size_t(n) * IC) : Tensor{}, dw, Tensor{}, out,
                       /*dout_split=*/true, xr, /*x_split=*/false, w, n, IC, OC_local, fp8);
  }
  if (!dinp || tp_.size() == 1) return;
  if (sp_) reduce_scatter_tokens(dinp, dx, N, IC);
  else tp_.all_reduce(dinp.slice(0, size_t(N) * IC));
}

void TensorParallel::row_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC_local, int OC,
                                 Fp8Site fp8) {
  // The bias joins the sum once, from rank 0.
  const Tensor b = tp_.rank() == 0 ? bias : Tensor{};
  if (sp_) {
    Tensor partial = scratch(kPartial, size_t(N) * OC, inp.dtype);
    product(partial, inp, /*x_split=*/true, w, b, N, IC_local, OC, fp8);
    reduce_scatter_tokens(out, partial, N, OC);
  } else {
    product(out, inp, /*x_split=*/true, w, b, N, IC_local, OC, fp8);
    tp_.all_reduce(out.slice(0, size_t(N) * OC));
  }
}

void TensorParallel::row_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N,
                                  int IC_local, int OC, Fp8Site fp8) {
  // dy is the full output gradient on every rank, so dbias comes out whole (and equal) on each.
  const Tensor dy = all_rows(dout, N, OC);
  product_backward(dinp, dw, dbias, dy, /*dout_split=*/false, inp, /*x_split=*/true, w, N, IC_local, OC, fp8);
}

void TensorParallel::row_backward_dgelu(Tensor dpre, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w,
                                        Tensor pre, int N, int IC_local, int OC, Fp8Site fp8) {
  const Tensor dy = all_rows(dout, N, OC);
  if (fp8.on()) {  // no fused epilogue for FP8 products: the product, then the GELU's backward in place
    product_backward(dpre, dw, dbias, dy, /*dout_split=*/false, inp, /*x_split=*/true, w, N, IC_local, OC, fp8);
    ops_.gelu_backward(dpre, pre, dpre, size_t(N) * IC_local);
    return;
  }
  ops_.matmul_backward_input_dgelu(dpre, dy, w, pre, N, IC_local, OC);
  ops_.matmul_backward(Tensor{}, dw, dbias, dy, inp, w, N, IC_local, OC);
}

}  // namespace pt
