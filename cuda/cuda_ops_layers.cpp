// CudaOps's layer ops (see cuda_ops.h): the embeddings, LayerNorm, the linear layer, the
// elementwise ops, Llama's RMSNorm, RoPE and SwiGLU, the losses, the optimizer and the
// reductions. Each checks its arguments (cuda_ops_args.h), then calls its kernels' launcher.
// Host code only, compiled by g++ against the CUDA runtime headers.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "cuda/adamw.h"
#include "cuda/cross_entropy.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_ops_args.h"
#include "cuda/elementwise.h"
#include "cuda/embedding.h"
#include "cuda/gelu.h"
#include "cuda/layernorm.h"
#include "cuda/matmul_cublaslt.h"
#include "cuda/norm_backward.h"
#include "cuda/reduce.h"
#include "cuda/rmsnorm.h"
#include "cuda/rope.h"
#include "cuda/swiglu.h"

namespace pt {

using namespace cuda_ops_args;

namespace {

// What the residual-add-then-norm ops share: a, b, residual and out [N, C] in one activation
// dtype (returned), w [C], and out clear of the other three (the fused kernel reads them while it
// writes out).
DType need_residual_norm(const char* op, Tensor residual, Tensor out, Tensor a, Tensor b, Tensor w, int N, int C) {
  check_dims(op, {N, C});
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(a, NC, op, "a");
  need(b, NC, dt, op, "b");
  need(residual, NC, dt, op, "residual");
  need(out, NC, dt, op, "out");
  need(w, C, dt, op, "w");
  check(NC == 0 || (!overlap(out, residual, NC) && !overlap(out, a, NC) && !overlap(out, b, NC)),
        where(op) + ": out overlaps residual, a or b");
  return dt;
}

}  // namespace

// ---- embeddings -----------------------------------------------------------------------------------

void CudaOps::embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int vocab_start,
                                int vocab_local) {
  check_dims("embedding_forward", {N, C, vocab_local});
  const DType dt = need_act(wte, size_t(vocab_local) * C, "embedding_forward", "wte");
  need(out, size_t(N) * C, dt, "embedding_forward", "out");
  need(tokens, N, DType::i32, "embedding_forward", "tokens");
  gpu::embedding_forward(dt, out.data, static_cast<const int32_t*>(tokens.data), wte.data, N, C, vocab_start,
                         vocab_local, stream_);
}

void CudaOps::embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int vocab_start,
                                 int vocab_local) {
  check_dims("embedding_backward", {N, C, vocab_local});
  if (!dwte) return;
  need(dwte, size_t(vocab_local) * C, "embedding_backward", "dwte");
  const DType dt = need_act(dout, size_t(N) * C, "embedding_backward", "dout");
  need(tokens, N, DType::i32, "embedding_backward", "tokens");
  const size_t bytes = gpu::embedding_backward_scratch_bytes(N, C, vocab_local);
  gpu::embedding_backward(dt, dwte.dtype, dwte.data, dout.data, static_cast<const int32_t*>(tokens.data), N, C,
                          vocab_start, vocab_local, scratch(bytes), bytes, stream_);
}

void CudaOps::position_forward(Tensor out, Tensor wpe, Tensor pos, int B, int T, int C) {
  check_dims("position_forward", {B, T, C});
  check(C > 0 || size_t(B) * T == 0, "CudaOps::position_forward: C must be positive");
  const DType dt = need_act(out, size_t(B) * T * C, "position_forward", "out");
  need(wpe, C, dt, "position_forward", "wpe");
  need(pos, T, DType::i32, "position_forward", "pos");
  const int rows = C > 0 ? static_cast<int>(std::min<size_t>(wpe.numel / C, 0x7fffffff)) : 0;
  gpu::position_forward(dt, out.data, wpe.data, static_cast<const int32_t*>(pos.data), B, T, C, rows, stream_);
}

void CudaOps::position_backward(Tensor dwpe, Tensor dout, Tensor pos, int B, int T, int C) {
  check_dims("position_backward", {B, T, C});
  if (!dwpe || C == 0) return;
  const DType dt = need_act(dout, size_t(B) * T * C, "position_backward", "dout");
  need(pos, T, DType::i32, "position_backward", "pos");
  const int rows = static_cast<int>(std::min<size_t>(dwpe.numel / C, 0x7fffffff));
  gpu::position_backward(dt, dwpe.dtype, dwpe.data, dout.data, static_cast<const int32_t*>(pos.data), B, T, C, rows,
                         stream_);
}

// ---- LayerNorm -----------------------------------------------------------------------------------

void CudaOps::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, int N, int C) {
  check_dims("layernorm_forward", {N, C});
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(inp, NC, "layernorm_forward", "inp");
  need(out, NC, dt, "layernorm_forward", "out");
  need(w, C, dt, "layernorm_forward", "w");
  need(b, C, dt, "layernorm_forward", "b");
  if (mean) need(mean, N, DType::f32, "layernorm_forward", "mean");
  if (rstd) need(rstd, N, DType::f32, "layernorm_forward", "rstd");
  gpu::layernorm_forward(dt, out.data, static_cast<float*>(mean.data), static_cast<float*>(rstd.data), inp.data,
                         w.data, b.data, N, C, stream_);
}

void CudaOps::residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b,
                                         Tensor w, Tensor bias, int N, int C) {
  const char* op = "residual_layernorm_forward";
  const DType dt = need_residual_norm(op, residual, out, a, b, w, N, C);
  const size_t NC = size_t(N) * C;
  need(bias, C, dt, op, "bias");
  if (mean) need(mean, N, DType::f32, op, "mean");
  if (rstd) need(rstd, N, DType::f32, op, "rstd");
  if (NC == 0) return;
  // The LayerNorm must be bitwise layernorm_forward's on the stored residual (recompute rebuilds
  // it that way). Both kernels sum a row in 16-byte chunks when C and their pointers allow it, in
  // single elements otherwise; the fused kernel also needs a and b aligned for its chunks. When
  // only a or b stands in the way (an odd slice), run the two kernels so the LayerNorm still
  // takes the chunked path layernorm_forward would.
  const int V = 16 / static_cast<int>(dtype_size(dt));
  const bool ln_chunked = C % V == 0 && is_aligned(out.data, 16) && is_aligned(residual.data, 16) &&
                          is_aligned(w.data, 16) && is_aligned(bias.data, 16);
  if (ln_chunked && !(is_aligned(a.data, 16) && is_aligned(b.data, 16))) {
    gpu::add(dt, residual.data, a.data, b.data, NC, stream_);
    gpu::layernorm_forward(dt, out.data, static_cast<float*>(mean.data), static_cast<float*>(rstd.data),
                           residual.data, w.data, bias.data, N, C, stream_);
    return;
  }
  gpu::fused_residual_layernorm_forward(dt, residual.data, out.data, static_cast<float*>(mean.data),
                                        static_cast<float*>(rstd.data), a.data, b.data, w.data, bias.data, N, C,
                                        stream_);
}

void CudaOps::layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                                 Tensor rstd, int N, int C) {
  check_dims("layernorm_backward", {N, C});
  if (!dinp && !dw && !db) return;
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(dout, NC, "layernorm_backward", "dout");
  need(inp, NC, dt, "layernorm_backward", "inp");
  need(mean, N, DType::f32, "layernorm_backward", "mean");
  need(rstd, N, DType::f32, "layernorm_backward", "rstd");
  if (dinp) {
    need(dinp, NC, dt, "layernorm_backward", "dinp");
    need(w, C, dt, "layernorm_backward", "w");
  }
  if (dw) need(dw, C, "layernorm_backward", "dw");
  if (db) need(db, C, "layernorm_backward", "db");
  const DType gt = grad_dtype("layernorm_backward", {&dw, &db}, DType::f32);
  void* s = (dw || db) ? scratch(gpu::layernorm_backward_scratch_bytes(N, C)) : nullptr;
  gpu::layernorm_backward(dt, gt, dinp.data, dw.data, db.data, dout.data, inp.data, w.data,
                          static_cast<const float*>(mean.data), static_cast<const float*>(rstd.data), N, C, s,
                          stream_);
}

// ---- linear layer --------------------------------------------------------------------------------

void CudaOps::matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC) {
  check_dims("matmul_forward", {N, IC, OC});
  const DType dt = need_act(inp, size_t(N) * IC, "matmul_forward", "inp");
  need(w, size_t(OC) * IC, dt, "matmul_forward", "w");
  const DType ot = need_act(out, size_t(N) * OC, "matmul_forward", "out");
  check(ot == dt || ot == DType::f32,
        "CudaOps::matmul_forward: out must be " + std::string(dtype_name(dt)) + " or f32");
  if (bias) need(bias, OC, ot, "matmul_forward", "bias");
  gpu::matmul_forward(matmul_, dt, ot, out.data, inp.data, w.data, bias.data, N, IC, OC, stream_);
}

void CudaOps::matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N, int IC,
                              int OC) {
  check_dims("matmul_backward", {N, IC, OC});
  if (!dinp && !dw && !dbias) return;
  const DType dt = need_act(dout, size_t(N) * OC, "matmul_backward", "dout");
  DType it = dt, wt = dt;
  if (dinp) {
    it = need_act(dinp, size_t(N) * IC, "matmul_backward", "dinp");
    check(it == dt || it == DType::f32,
          "CudaOps::matmul_backward: dinp must be " + std::string(dtype_name(dt)) + " or f32");
    need(w, size_t(OC) * IC, dt, "matmul_backward", "w");
  }
  if (dw) {
    wt = need_act(dw, size_t(OC) * IC, "matmul_backward", "dw");
    check(wt == dt || wt == DType::f32,
          "CudaOps::matmul_backward: dw must be " + std::string(dtype_name(dt)) + " or f32");
    need(inp, size_t(N) * IC, dt, "matmul_backward", "inp");
  }
  if (dbias) need(dbias, OC, "matmul_backward", "dbias");
  void* db_scratch = dbias ? scratch(gpu::bias_backward_scratch_bytes(N, OC)) : nullptr;
  // dinp and dW are independent products (both read dout; dinp writes only itself): dW, with
  // the bias gradient, runs on the side stream beside dinp, each with its own cuBLASLt workspace
  // (lane 1), and stream_ waits for both before its next op. A dW product alone has few tiles
  // (m = IC, n = OC, k = N: 108 at GPT-2 124M's qkv for 132 SMs); beside dinp the idle SMs work.
  // Each product's bits are what they are alone. Not while matmul algorithms are timed (a
  // candidate's time would include the other product's), nor with PICOTRAIN_MATMUL_STREAMS=1.
  const bool beside = dinp && dw && !gpu::matmul_timing(matmul_);
  run_beside(
      beside,
      [&] {
        if (dinp) gpu::matmul_backward_input(matmul_, dt, it, dinp.data, dout.data, w.data, N, IC, OC, stream_);
      },
      [&](void* dw_stream, int lane) {
        if (dw) {  // dbias (if wanted) comes with dW, from the same product where cuBLASLt can
          gpu::matmul_backward_weight(matmul_, dt, wt, dw.data, dbias.dtype, dbias.data, dout.data, inp.data, N, IC,
                                      OC, db_scratch, dw_stream, lane);
        } else if (dbias) {
          gpu::bias_backward(dt, dbias.dtype, dbias.data, dout.data, N, OC, db_scratch, dw_stream);
        }
      });
}

void CudaOps::run_beside(bool beside, const std::function<void()>& first,
                         const std::function<void(void* stream, int lane)>& second) {
  beside = beside && dw_beside_dinp_;
  if (!beside) {
    first();
    second(stream_, 0);
    return;
  }
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(fork_), as_stream(stream_)));
  CUDA_CHECK(cudaStreamWaitEvent(as_stream(side_stream_), static_cast<cudaEvent_t>(fork_), 0));
  first();
  second(side_stream_, 1);
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(join_), as_stream(side_stream_)));
  CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), static_cast<cudaEvent_t>(join_), 0));
}

// The GELU-fused pair (gpu::matmul_gelu_forward, matmul_backward_input_dgelu): one dtype for
// every tensor, the activations'.
void CudaOps::matmul_gelu_forward(Tensor out, Tensor out_pre, Tensor inp, Tensor w, Tensor bias, int N, int IC,
                                  int OC) {
  check_dims("matmul_gelu_forward", {N, IC, OC});
  const DType dt = need_act(inp, size_t(N) * IC, "matmul_gelu_forward", "inp");
  need(w, size_t(OC) * IC, dt, "matmul_gelu_forward", "w");
  need(out, size_t(N) * OC, dt, "matmul_gelu_forward", "out");
  need(out_pre, size_t(N) * OC, dt, "matmul_gelu_forward", "out_pre");
  if (bias) need(bias, OC, dt, "matmul_gelu_forward", "bias");
  gpu::matmul_gelu_forward(matmul_, dt, out.data, out_pre.data, inp.data, w.data, bias.data, N, IC, OC, stream_);
}

void CudaOps::matmul_backward_input_dgelu(Tensor dpre, Tensor dout, Tensor w, Tensor pre, int N, int IC, int OC) {
  check_dims("matmul_backward_input_dgelu", {N, IC, OC});
  const DType dt = need_act(dout, size_t(N) * OC, "matmul_backward_input_dgelu", "dout");
  need(dpre, size_t(N) * IC, dt, "matmul_backward_input_dgelu", "dpre");
  need(w, size_t(OC) * IC, dt, "matmul_backward_input_dgelu", "w");
  need(pre, size_t(N) * IC, dt, "matmul_backward_input_dgelu", "pre");
  gpu::matmul_backward_input_dgelu(matmul_, dt, dpre.data, dout.data, w.data, pre.data, N, IC, OC, stream_);
}

// ---- elementwise ---------------------------------------------------------------------------------

void CudaOps::gelu_forward(Tensor out, Tensor inp, size_t n) {
  const DType dt = need_act(inp, n, "gelu_forward", "inp");
  need(out, n, dt, "gelu_forward", "out");
  gpu::gelu_forward(dt, out.data, inp.data, n, stream_);
}

void CudaOps::gelu_backward(Tensor dinp, Tensor inp, Tensor dout, size_t n) {
  if (!dinp) return;
  const DType dt = need_act(inp, n, "gelu_backward", "inp");
  need(dinp, n, dt, "gelu_backward", "dinp");
  need(dout, n, dt, "gelu_backward", "dout");
  gpu::gelu_backward(dt, dinp.data, inp.data, dout.data, n, stream_);
}

void CudaOps::add(Tensor out, Tensor a, Tensor b, size_t n) {
  const DType dt = need_act(a, n, "add", "a");
  need(b, n, dt, "add", "b");
  need(out, n, dt, "add", "out");
  gpu::add(dt, out.data, a.data, b.data, n, stream_);
}

void CudaOps::scale(Tensor x, float s, size_t n) {
  const DType dt = need_act(x, n, "scale", "x");
  gpu::scale(dt, x.data, s, n, stream_);
}

// ---- Llama: RMSNorm, RoPE, SwiGLU --------------------------------------------------------------

void CudaOps::rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, int N, int C, float eps) {
  check_dims("rmsnorm_forward", {N, C});
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(inp, NC, "rmsnorm_forward", "inp");
  need(out, NC, dt, "rmsnorm_forward", "out");
  need(w, C, dt, "rmsnorm_forward", "w");
  if (rstd) need(rstd, N, DType::f32, "rmsnorm_forward", "rstd");
  gpu::rmsnorm_forward(dt, out.data, static_cast<float*>(rstd.data), inp.data, w.data, N, C, eps, stream_);
}

void CudaOps::residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor w, int N,
                                       int C, float eps) {
  const char* op = "residual_rmsnorm_forward";
  const DType dt = need_residual_norm(op, residual, out, a, b, w, N, C);
  const size_t NC = size_t(N) * C;
  if (rstd) need(rstd, N, DType::f32, op, "rstd");
  if (NC == 0) return;
  // Bitwise rmsnorm_forward on the stored residual needs the same summation path (16-byte chunks
  // or single elements) as rmsnorm_forward would take; when only a or b keeps the fused kernel
  // off the chunked path, run the two kernels instead (as residual_layernorm_forward does).
  const int V = 16 / static_cast<int>(dtype_size(dt));
  const bool norm_chunked =
      C % V == 0 && is_aligned(out.data, 16) && is_aligned(residual.data, 16) && is_aligned(w.data, 16);
  float* rs = static_cast<float*>(rstd.data);
  if (norm_chunked && !(is_aligned(a.data, 16) && is_aligned(b.data, 16))) {
    gpu::add(dt, residual.data, a.data, b.data, NC, stream_);
    gpu::rmsnorm_forward(dt, out.data, rs, residual.data, w.data, N, C, eps, stream_);
    return;
  }
  gpu::fused_residual_rmsnorm_forward(dt, residual.data, out.data, rs, a.data, b.data, w.data, N, C, eps, stream_);
}

void CudaOps::rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd, int N, int C) {
  const char* op = "rmsnorm_backward";
  check_dims(op, {N, C});
  if (!dinp && !dw) return;
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(dout, NC, op, "dout");
  need(inp, NC, dt, op, "inp");
  need(rstd, N, DType::f32, op, "rstd");
  if (dinp) {
    need(dinp, NC, dt, op, "dinp");
    need(w, C, dt, op, "w");
  }
  if (dw) need(dw, C, op, "dw");
  const DType gt = grad_dtype(op, {&dw}, DType::f32);
  void* s = dw ? scratch(gpu::rmsnorm_backward_scratch_bytes(N, C)) : nullptr;
  gpu::rmsnorm_backward(dt, gt, dinp.data, dw.data, dout.data, inp.data, w.data, static_cast<const float*>(rstd.data),
                        N, C, s, stream_);
}

void CudaOps::rope_forward(Tensor qkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS, float theta) {
  check_dims("rope_forward", {B, T, row_width, rot_heads, HS});
  const DType dt = need_act(qkv, size_t(B) * T * row_width, "rope_forward", "qkv");
  need(pos, T, DType::i32, "rope_forward", "pos");
  gpu::rope_forward(dt, qkv.data, static_cast<const int32_t*>(pos.data), B, T, row_width, rot_heads, HS, theta,
                    stream_);
}

void CudaOps::rope_backward(Tensor dqkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS,
                            float theta) {
  check_dims("rope_backward", {B, T, row_width, rot_heads, HS});
  const DType dt = need_act(dqkv, size_t(B) * T * row_width, "rope_backward", "dqkv");
  need(pos, T, DType::i32, "rope_backward", "pos");
  gpu::rope_backward(dt, dqkv.data, static_cast<const int32_t*>(pos.data), B, T, row_width, rot_heads, HS, theta,
                     stream_);
}

void CudaOps::swiglu_forward(Tensor out, Tensor gate_up, int N, int H) {
  check_dims("swiglu_forward", {N, H});
  const DType dt = need_act(gate_up, size_t(N) * 2 * H, "swiglu_forward", "gate_up");
  need(out, size_t(N) * H, dt, "swiglu_forward", "out");
  gpu::swiglu_forward(dt, out.data, gate_up.data, N, H, stream_);
}

void CudaOps::swiglu_backward(Tensor dgate_up, Tensor gate_up, Tensor dout, int N, int H) {
  check_dims("swiglu_backward", {N, H});
  if (!dgate_up) return;
  const DType dt = need_act(gate_up, size_t(N) * 2 * H, "swiglu_backward", "gate_up");
  need(dgate_up, size_t(N) * 2 * H, dt, "swiglu_backward", "dgate_up");
  need(dout, size_t(N) * H, dt, "swiglu_backward", "dout");
  gpu::swiglu_backward(dt, dgate_up.data, gate_up.data, dout.data, N, H, stream_);
}

// ---- loss ---------------------------------------------------------------------------------------

void CudaOps::softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int Vp, float dloss) {
  check_dims("softmax_cross_entropy", {N, V, Vp});
  check(V > 0 && V <= Vp, "CudaOps::softmax_cross_entropy: need 0 < V <= Vp, got V=" + std::to_string(V) +
                              " Vp=" + std::to_string(Vp));
  need(losses, N, DType::f32, "softmax_cross_entropy", "losses");
  const DType dt = need_act(logits, size_t(N) * Vp, "softmax_cross_entropy", "logits");
  need(targets, N, DType::i32, "softmax_cross_entropy", "targets");
  gpu::softmax_cross_entropy(dt, static_cast<float*>(losses.data), logits.data,
                             static_cast<const int32_t*>(targets.data), N, V, Vp, dloss, stream_);
}

// ---- optimizer and reductions ------------------------------------------------------------------------

void CudaOps::cross_entropy_shard_stats(Tensor stats, Tensor logits, Tensor targets, int N, int Vl, int V,
                                        int vocab_start) {
  const char* op = "cross_entropy_shard_stats";
  check_dims(op, {N, Vl, V, vocab_start});
  check(V > 0, where(op) + ": the vocabulary size must be positive");
  need(stats, size_t(N) * 3, DType::f32, op, "stats");
  const DType dt = need_act(logits, size_t(N) * Vl, op, "logits");
  need(targets, N, DType::i32, op, "targets");
  gpu::cross_entropy_shard_stats(dt, static_cast<float*>(stats.data), logits.data,
                                 static_cast<const int32_t*>(targets.data), N, Vl, V, vocab_start, stream_);
}

void CudaOps::cross_entropy_shard_finish(Tensor losses, Tensor logits, Tensor targets, Tensor all_stats, int shards,
                                         int N, int Vl, int V, int vocab_start, float dloss) {
  const char* op = "cross_entropy_shard_finish";
  check_dims(op, {N, Vl, V, vocab_start});
  check(V > 0 && shards >= 1, where(op) + ": need V > 0 and at least one shard");
  need(losses, N, DType::f32, op, "losses");
  const DType dt = need_act(logits, size_t(N) * Vl, op, "logits");
  need(targets, N, DType::i32, op, "targets");
  need(all_stats, size_t(shards) * N * 3, DType::f32, op, "all_stats");
  gpu::cross_entropy_shard_finish(dt, static_cast<float*>(losses.data), logits.data,
                                  static_cast<const int32_t*>(targets.data), static_cast<const float*>(all_stats.data),
                                  shards, N, Vl, V, vocab_start, dloss, stream_);
}

void CudaOps::adamw_update(Tensor params, Tensor master, Tensor grad, Tensor m, Tensor v, size_t n, float lr,
                           float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale, Tensor step) {
  check(step || t >= 1, "CudaOps::adamw_update: step t=" + std::to_string(t) + " must be >= 1 (bias correction)");
  if (step) need(step, 4, DType::f32, "adamw_update", "step");
  need(master, n, DType::f32, "adamw_update", "master");
  need(grad, n, DType::f32, "adamw_update", "grad");
  need(m, n, DType::f32, "adamw_update", "m");
  need(v, n, DType::f32, "adamw_update", "v");
  if (params) need_act(params, n, "adamw_update", "params");
  // The same scalars as CpuOps (unused when the kernel reads them from `step`).
  const AdamwStepScalars s = step ? AdamwStepScalars{} : adamw_step_scalars(lr, beta1, beta2, t, grad_scale);
  gpu::adamw_update(params.dtype, params.data, static_cast<float*>(master.data), static_cast<const float*>(grad.data),
                    static_cast<float*>(m.data), static_cast<float*>(v.data), n, s.lr, beta1, beta2, eps, weight_decay,
                    s.correction1, s.correction2, s.grad_scale, static_cast<const float*>(step.data), stream_);
}

double CudaOps::reduce(Tensor x, size_t n, bool square, const char* op) {
  const DType dt = need_act(x, n, op, "x");
  gpu::reduce_sum(dt, result_, x.data, n, square, scratch(gpu::reduce_scratch_bytes()), stream_);
  double host = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&host, result_, sizeof host, cudaMemcpyDeviceToHost, as_stream(stream_)));
  CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
  return host;
}

double CudaOps::sum_squares(Tensor x, size_t n) { return reduce(x, n, true, "sum_squares"); }

double CudaOps::sum(Tensor x, size_t n) { return reduce(x, n, false, "sum"); }

void CudaOps::sum_to(Tensor out, Tensor x, size_t n) {
  need(out, 1, DType::f32, "sum_to", "out");
  const DType dt = need_act(x, n, "sum_to", "x");
  gpu::reduce_sum_to_float(dt, static_cast<float*>(out.data), x.data, n, scratch(gpu::reduce_scratch_bytes()), stream_);
}

}  // namespace pt
