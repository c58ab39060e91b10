// Host launchers for causal self-attention on the GPU. Two implementations of the same math
// (see Ops::attention_forward/backward):
//  - flash_attention_*_bf16 (flash_attention_forward.cu, flash_attention_backward.cu): bf16
//    tensor-core (mma.sync m16n8k16, ldmatrix, cp.async; sm_80+) flash attention for head sizes
//    64 and 128;
//  - attention_*_tiled (attention_tiled.cu): CUDA-core tiled kernels for f32 or bf16 and any
//    head size, fp32 math throughout: the fp32 backend's kernel (it matches CpuOps to ~1e-6)
//    and the bf16 fallback for other head sizes.
// Both read qkv [B, T, (NH + 2 NKV) HS] (q: NH heads | k: NKV heads | v: NKV heads, head h at
// channels [h*HS, (h+1)*HS) of each part; grouped-query attention: query head h reads key/value
// head h / (NH / NKV), NKV == NH is multi-head), write out [B, T, NH*HS] and lse [B, NH, T]
// (fp32, natural log), and never hold a T x T matrix nor repeat a K/V head.
// Backward OVERWRITES dqkv (every element, whatever it held; a key/value head's gradient sums
// its group's query heads, deterministically) and needs D = rowsum(dout * out) per (b, h, t)
// first (attention_row_dot, into fp32 scratch of B*NH*T floats). Same stream conventions as
// the other launchers.
#pragma once
#include "core/tensor/tensor.h"

namespace pt::gpu {

// True when the tensor-core kernels handle this call: bf16, HS 64 or 128, 16-byte aligned tensors.
bool flash_attention_supported(DType dtype, int HS, const void* qkv, const void* out_or_dout, const void* dqkv);

// Runs the Hopper kernel where flash_forward_path() says so, else the sm_80 kernel.
void flash_attention_forward_bf16(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int HS,
                                  void* stream = nullptr);

// The forward's Hopper kernel (flash_attention_forward_sm90.cu: wgmma, TMA, warp-specialised),
// the same contract; it needs flash_forward_sm90_available(): a compute capability 9.0 GPU and a
// build with sm_90a code. Called by flash_attention_forward_bf16, after its argument checks.
bool flash_forward_sm90_available();
void flash_attention_forward_sm90_bf16(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int HS,
                                       void* stream = nullptr);
// Which forward kernel flash_attention_forward_bf16 runs: mma (the sm_80 kernel everywhere),
// wgmma (the Hopper kernel; an error where it is not available) or automatic (the Hopper kernel
// where available). From PICOTRAIN_FLASH_FORWARD=mma|wgmma|auto, read once; mma when unset, until
// the Hopper kernel has passed gpu_attention on a GPU. Tests and benchmarks set it.
enum class FlashForwardPath { mma, wgmma, automatic };
FlashForwardPath flash_forward_path();
void set_flash_forward_path(FlashForwardPath path);
// The backward's workspace (16-byte aligned, its contents don't matter): dQ (and, under GQA, dK
// and dV) partial sums and the counters that fix the order in which blocks add them
// (flash_attention_backward.cu).
size_t flash_attention_backward_workspace_bytes(int B, int T, int NH, int NKV, int HS);
void flash_attention_backward_bf16(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D,
                                   int B, int T, int NH, int NKV, int HS, void* workspace, void* stream = nullptr);

void attention_forward_tiled(DType dtype, void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int HS,
                             void* stream = nullptr);
void attention_backward_tiled(DType dtype, void* dqkv, const void* dout, const void* qkv, const float* lse,
                              const float* D, int B, int T, int NH, int NKV, int HS, void* stream = nullptr);

// Attention of Tq queries against Tk keys/values in separate tensors with position offsets
// (attention_block.cu; CUDA cores, f32 or bf16, any head size): q, out [B, Tq, NH*HS], k, v
// [B, Tk, NKV*HS]; see Ops::attention_block_forward/backward. Backward ACCUMULATES into dq, dk,
// dv (each may be null; dk/dv sum the group's query heads) and needs D = rowsum(dout * out) of
// the FINAL out (attention_row_dot with T = Tq).
void attention_block_forward_tiled(DType dtype, void* out, float* lse, const void* q, const void* k, const void* v,
                                   int B, int Tq, int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0, bool causal,
                                   void* stream = nullptr);
void attention_block_backward_tiled(DType dtype, void* dq, void* dk, void* dv, const void* dout, const void* q,
                                    const void* k, const void* v, const float* lse, const float* D, int B, int Tq,
                                    int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0, bool causal,
                                    void* stream = nullptr);
// out_acc, lse_acc <- the log-sum-exp weighted merge with out_part, lse_part (Ops::merge_attention_partials).
void merge_attention_partials_gpu(DType dtype, void* out_acc, float* lse_acc, const void* out_part,
                                  const float* lse_part, int B, int T, int NH, int HS, void* stream = nullptr);

// D[b, h, t] = sum_c dout[b, t, h*HS + c] * out[b, t, h*HS + c]  (fp32), any dtype/head size.
void attention_row_dot(DType dtype, float* D, const void* dout, const void* out, int B, int T, int NH, int HS,
                       void* stream = nullptr);

}  // namespace pt::gpu
