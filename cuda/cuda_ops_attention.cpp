// CudaOps's attention ops (see cuda_ops.h): causal attention (the flash
// kernels in bf16, the tiled ones otherwise; in FP8, the casts and the FP8 flash forward, and the
// backward on the dequantised inputs), its blocks for context parallelism and KV caches (the
// flash kernels where they apply, the CUDA-core block kernels otherwise). Each checks its
// arguments (cuda_ops_args.h),
// then calls its kernels' launcher. Host code only, compiled by g++ against the CUDA runtime headers.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "cuda/attention.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_ops_args.h"

namespace pt {

using namespace cuda_ops_args;

// ---- attention -----------------------------------------------------------------------------------

namespace {
int head_size(const char* op, int C, int NH) {
  check(NH > 0 && C % NH == 0, where(op) + ": n_heads=" + std::to_string(NH) + " must be positive and divide C=" +
                                   std::to_string(C));
  return C / NH;
}
// The head size of grouped-query attention: NH query heads of C / NH channels sharing NKV
// key/value heads, NKV dividing NH.
int gqa_head_size(const char* op, int C, int NH, int NKV) {
  const int HS = head_size(op, C, NH);
  check(NKV > 0 && NH % NKV == 0, where(op) + ": n_kv_heads=" + std::to_string(NKV) +
                                      " must be positive and divide n_heads=" + std::to_string(NH));
  return HS;
}
// The head size the flash kernels run a head of HS channels at (gpu::flash_padded_head_size: HS
// itself for 256 on Hopper, else zero-padded), where flash_attention_supported does not take HS
// itself: bf16 and 16-byte aligned tensors (the copies move 16-byte chunks); 0 where the CUDA-core
// kernels run instead.
int padded_flash_head_size(DType dt, int HS, std::initializer_list<const void*> tensors) {
  if (dt != DType::bf16) return 0;
  for (const void* p : tensors)
    if (!is_aligned(p, 16)) return 0;
  return gpu::flash_padded_head_size(HS, HS > 128 && gpu::flash_hopper_head_sizes());
}
size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }
// The scratch bytes of `rows` rows of `heads` bf16 heads of hs channels (a padded copy), rounded
// to 256 so that what follows stays aligned.
size_t heads_bytes(size_t rows, int heads, int hs) { return round256(rows * heads * hs * sizeof(uint16_t)); }
// 1/sqrt(HS), as the kernels compute it for their own head size.
float softmax_scale(int HS) { return 1.0f / std::sqrt(static_cast<float>(HS)); }
}  // namespace

void CudaOps::attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) {
  check_dims("attention_forward", {B, T, C});
  const int HS = gqa_head_size("attention_forward", C, NH, NKV);
  const size_t BT = size_t(B) * T, W = size_t(NH + 2 * NKV) * HS;  // W: the packed q | k | v row
  const DType dt = need_act(qkv, BT * W, "attention_forward", "qkv");
  need(out, BT * C, dt, "attention_forward", "out");
  need(lse, size_t(B) * NH * T, DType::f32, "attention_forward", "lse");
  float* L = static_cast<float*>(lse.data);
  const bool flash = gpu::flash_attention_supported(dt, HS, qkv.data, out.data, nullptr);
  const int HSp = flash ? HS : padded_flash_head_size(dt, HS, {qkv.data, out.data});
  if (HSp == HS) {
    gpu::flash_attention_forward_bf16(out.data, L, qkv.data, B, T, NH, NKV, HS, stream_);
  } else if (HSp) {
    // q, k, v in heads of HSp (zero-padded), the flash forward at the head's own scale, out back.
    const size_t qkv_bytes = heads_bytes(BT, NH + 2 * NKV, HSp);
    char* space = static_cast<char*>(scratch(qkv_bytes + heads_bytes(BT, NH, HSp)));
    gpu::copy_heads_bf16(space, HSp, qkv.data, HS, BT, NH + 2 * NKV, stream_);
    gpu::flash_attention_forward_bf16(space + qkv_bytes, L, space, B, T, NH, NKV, HSp, stream_, softmax_scale(HS));
    gpu::copy_heads_bf16(out.data, HS, space + qkv_bytes, HSp, BT, NH, stream_);
  } else {
    gpu::attention_forward_tiled(dt, out.data, L, qkv.data, B, T, NH, NKV, HS, stream_);
  }
}

void CudaOps::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int C,
                                 int NH, int NKV) {
  attention_backward_impl("attention_backward", dqkv, dout, qkv, out, lse, B, T, C, NH, NKV, false);
}

void CudaOps::attention_backward_impl(const char* op, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse,
                                      int B, int T, int C, int NH, int NKV, bool fp8) {
  check_dims(op, {B, T, C});
  const int HS = gqa_head_size(op, C, NH, NKV);
  if (fp8) require_fp8_attention(op, HS);
  if (!dqkv) return;
  const size_t BT = size_t(B) * T, W = size_t(NH + 2 * NKV) * HS;
  const DType dt = need_act(qkv, BT * W, op, "qkv");
  if (fp8) {
    need(qkv, BT * W, DType::bf16, op, "qkv");
    check(is_aligned(qkv.data, 16), where(op) + ": qkv must be 16-byte aligned (the FP8 casts move 16-byte chunks)");
  }
  need(dqkv, BT * W, dt, op, "dqkv");
  need(dout, BT * C, dt, op, "dout");
  need(out, BT * C, dt, op, "out");
  need(lse, size_t(B) * NH * T, DType::f32, op, "lse");
  // (FP8: the dequantised copy in scratch is aligned, and qkv is, so qkv answers for it here.)
  // The flash kernels at HS itself, or at HSp with q, k, v and dout zero-padded and dqkv copied back.
  const int kernel_hs = gpu::flash_attention_supported(dt, HS, qkv.data, dout.data, dqkv.data)
                            ? HS
                            : padded_flash_head_size(dt, HS, {qkv.data, dout.data, dqkv.data});
  const bool flash = kernel_hs == HS;
  const int HSp = flash ? 0 : kernel_hs;  // 0 unless padded
  // One scratch request for D, the flash kernel's workspace, for FP8 the dequantised qkv and the
  // amaxes of its cast, and the padded copies (a second request could move the first).
  const size_t d_bytes = round256(size_t(B) * NH * T * sizeof(float));
  const size_t ws_bytes =
      kernel_hs ? round256(gpu::flash_attention_backward_workspace_bytes(B, T, NH, NKV, kernel_hs)) : 0;
  const size_t dq_bytes = fp8 ? round256(BT * W * dtype_size(dt)) : 0;
  const size_t amax_bytes = fp8 ? round256(size_t(B) * (NH + 2 * NKV) * sizeof(float)) : 0;
  const size_t padded_qkv_bytes = heads_bytes(BT, NH + 2 * NKV, HSp);  // 0 unless padded
  const size_t padded_dout_bytes = heads_bytes(BT, NH, HSp);
  char* space = static_cast<char*>(
      scratch(d_bytes + ws_bytes + dq_bytes + amax_bytes + 2 * padded_qkv_bytes + padded_dout_bytes));
  float* D = reinterpret_cast<float*>(space);
  const void* x = qkv.data;  // the q, k, v the gradient is taken at
  if (fp8 && BT > 0) {
    char* dq = space + d_bytes + ws_bytes;
    gpu::attention_fp8_dequantize(dq, reinterpret_cast<float*>(dq + dq_bytes), qkv.data, B, T, NH, NKV, HS, stream_);
    x = dq;
  }
  gpu::attention_row_dot(dt, D, dout.data, out.data, B, T, NH, HS, stream_);
  const float* L = static_cast<const float*>(lse.data);
  if (flash) {
    gpu::flash_attention_backward_bf16(dqkv.data, dout.data, x, L, D, B, T, NH, NKV, HS, space + d_bytes, stream_);
  } else if (HSp) {
    char* qkv_p = space + d_bytes + ws_bytes + dq_bytes + amax_bytes;
    char* dqkv_p = qkv_p + padded_qkv_bytes;
    char* dout_p = dqkv_p + padded_qkv_bytes;
    gpu::copy_heads_bf16(qkv_p, HSp, x, HS, BT, NH + 2 * NKV, stream_);
    gpu::copy_heads_bf16(dout_p, HSp, dout.data, HS, BT, NH, stream_);
    gpu::flash_attention_backward_bf16(dqkv_p, dout_p, qkv_p, L, D, B, T, NH, NKV, HSp, space + d_bytes, stream_,
                                       softmax_scale(HS));
    gpu::copy_heads_bf16(dqkv.data, HS, dqkv_p, HSp, BT, NH + 2 * NKV, stream_);
  } else {
    gpu::attention_backward_tiled(dt, dqkv.data, dout.data, x, L, D, B, T, NH, NKV, HS, stream_);
  }
}

// ---- FP8 attention ---------------------------------------------------------------------------------

bool CudaOps::supports_fp8_attention(int head_size) const {
  return fp8_ && compute_ == DType::bf16 && (head_size == 64 || head_size == 128) &&
         gpu::flash_attention_fp8_available();
}

void CudaOps::require_fp8_attention(const char* op, int HS) const {
  check(fp8_, where(op) + ": FP8 attention needs compute capability 8.9+ (Ada, Hopper or newer); this GPU is " +
                  description_ + " (Ops::supports_fp8_attention says so before a run starts)");
  check(gpu::flash_attention_fp8_available(),
        where(op) + ": this build has no code of the FP8 attention kernel for " + description_ +
            " (sm_80 code runs there; add its architecture, e.g. 89 or 90a, to PICOTRAIN_CUDA_ARCHS)");
  check(HS == 64 || HS == 128,
        where(op) + ": head size " + std::to_string(HS) + " has no FP8 attention kernel (64 or 128)");
}

void CudaOps::attention_fp8_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) {
  const char* op = "attention_fp8_forward";
  check_dims(op, {B, T, C});
  const int HS = gqa_head_size(op, C, NH, NKV);
  require_fp8_attention(op, HS);
  const size_t BT = size_t(B) * T, W = size_t(NH + 2 * NKV) * HS;
  need(qkv, BT * W, DType::bf16, op, "qkv");
  need(out, BT * C, DType::bf16, op, "out");
  need(lse, size_t(B) * NH * T, DType::f32, op, "lse");
  check(is_aligned(qkv.data, 16) && is_aligned(out.data, 16),
        where(op) + ": qkv and out must be 16-byte aligned (the FP8 kernels move 16-byte chunks)");
  if (BT == 0) return;
  void* space = scratch(gpu::attention_fp8_codes_bytes(B, T, NH, NKV, HS));
  const gpu::Fp8AttentionCodes codes = gpu::attention_fp8_codes_at(space, B, T, NH, NKV, HS);
  gpu::attention_fp8_quantize(codes, qkv.data, B, T, NH, NKV, HS, stream_);
  gpu::flash_attention_fp8_forward(out.data, static_cast<float*>(lse.data), codes, B, T, NH, NKV, HS, stream_);
}

void CudaOps::attention_fp8_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T,
                                     int C, int NH, int NKV) {
  attention_backward_impl("attention_fp8_backward", dqkv, dout, qkv, out, lse, B, T, C, NH, NKV, true);
}

void CudaOps::attention_block_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int Tq, int Tk,
                                      int C, int NH, int NKV, int q_pos0, int k_pos0, bool causal) {
  const char* op = "attention_block_forward";
  check_dims(op, {B, Tq, Tk, C});
  const int HS = gqa_head_size(op, C, NH, NKV);
  const size_t nk = size_t(B) * Tk * NKV * HS;
  const DType dt = need_act(q, size_t(B) * Tq * C, op, "q");
  need(k, nk, dt, op, "k");
  need(v, nk, dt, op, "v");
  need(out, size_t(B) * Tq * C, dt, op, "out");
  need(lse, size_t(B) * NH * Tq, DType::f32, op, "lse");
  float* L = static_cast<float*>(lse.data);
  if (gpu::flash_attention_block_supported(dt, HS, Tk, q_pos0, k_pos0, causal, false,
                                           {q.data, k.data, v.data, out.data})) {
    const size_t ws = gpu::flash_attention_block_forward_workspace_bytes(B, Tq, Tk, NH, HS);
    gpu::flash_attention_block_forward_bf16(out.data, L, q.data, k.data, v.data, B, Tq, Tk, NH, NKV, HS, q_pos0, k_pos0,
                                            causal, ws ? scratch(ws) : nullptr, stream_);
  } else
    gpu::attention_block_forward_tiled(dt, out.data, L, q.data, k.data, v.data, B, Tq, Tk, NH, NKV, HS, q_pos0, k_pos0,
                                       causal, stream_);
}

void CudaOps::attention_block_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                                       Tensor out, Tensor lse, int B, int Tq, int Tk, int C, int NH, int NKV,
                                       int q_pos0, int k_pos0, bool causal) {
  const char* op = "attention_block_backward";
  check_dims(op, {B, Tq, Tk, C});
  const int HS = gqa_head_size(op, C, NH, NKV);
  if (!dq && !dk && !dv) return;
  const size_t nq = size_t(B) * Tq * C, nk = size_t(B) * Tk * NKV * HS;
  const DType dt = need_act(q, nq, op, "q");
  need(k, nk, dt, op, "k");
  need(v, nk, dt, op, "v");
  need(dout, nq, dt, op, "dout");
  need(out, nq, dt, op, "out");
  need(lse, size_t(B) * NH * Tq, DType::f32, op, "lse");
  if (dq) need(dq, nq, dt, op, "dq");
  if (dk) need(dk, nk, dt, op, "dk");
  if (dv) need(dv, nk, dt, op, "dv");
  const bool flash = gpu::flash_attention_block_supported(
      dt, HS, Tk, q_pos0, k_pos0, causal, true, {q.data, k.data, v.data, dout.data, dq.data, dk.data, dv.data});
  // One scratch request for D and the flash kernel's workspace (a second could move the first).
  const size_t d_bytes = (size_t(B) * NH * Tq * sizeof(float) + 255) / 256 * 256;
  const size_t ws_bytes = flash ? gpu::flash_attention_block_backward_workspace_bytes(B, Tq, Tk, NH, NKV, HS) : 0;
  char* space = static_cast<char*>(scratch(d_bytes + ws_bytes));
  float* D = reinterpret_cast<float*>(space);
  const float* L = static_cast<const float*>(lse.data);
  gpu::attention_row_dot(dt, D, dout.data, out.data, B, Tq, NH, HS, stream_);
  if (flash)
    gpu::flash_attention_block_backward_bf16(dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data, L, D, B, Tq,
                                             Tk, NH, NKV, HS, q_pos0, k_pos0, causal, space + d_bytes, stream_);
  else
    gpu::attention_block_backward_tiled(dt, dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data, L, D, B, Tq,
                                        Tk, NH, NKV, HS, q_pos0, k_pos0, causal, stream_);
}

void CudaOps::merge_attention_partials(Tensor out_acc, Tensor lse_acc, Tensor out_part, Tensor lse_part, int B, int T,
                                       int C, int NH) {
  const char* op = "merge_attention_partials";
  check_dims(op, {B, T, C});
  const int HS = head_size(op, C, NH);
  const DType dt = need_act(out_acc, size_t(B) * T * C, op, "out_acc");
  need(out_part, size_t(B) * T * C, dt, op, "out_part");
  need(lse_acc, size_t(B) * NH * T, DType::f32, op, "lse_acc");
  need(lse_part, size_t(B) * NH * T, DType::f32, op, "lse_part");
  gpu::merge_attention_partials_gpu(dt, out_acc.data, static_cast<float*>(lse_acc.data), out_part.data,
                                    static_cast<const float*>(lse_part.data), B, T, NH, HS, stream_);
}

}  // namespace pt
