// Host launchers for causal self-attention on the GPU. Two implementations of the same math
// (see Ops::attention_forward/backward):
//  - flash_attention_*_bf16 (flash_attention_forward.cu, flash_attention_backward.cu, and on
//    Hopper flash_attention_*_sm90.cu): bf16 tensor-core flash attention for head sizes 64 and
//    128 (and, zero-padded to those by CudaOps, the multiples of 8 up to 128);
//  - attention_*_tiled (attention_tiled.cu): CUDA-core tiled kernels for f32 or bf16 and any
//    head size, fp32 math throughout: the fp32 backend's kernel (it matches CpuOps to ~1e-6)
//    and the bf16 fallback for other head sizes.
// (FP8 attention, at the end: its casts and its own forward kernel; its backward is the above's.)
// Both read qkv [B, T, (NH + 2 NKV) HS] (q: NH heads | k: NKV heads | v: NKV heads, head h at
// channels [h*HS, (h+1)*HS) of each part; grouped-query attention: query head h reads key/value
// head h / (NH / NKV), NKV == NH is multi-head), write out [B, T, NH*HS] and lse [B, NH, T]
// (fp32, natural log), and never hold a T x T matrix nor repeat a K/V head.
// Backward OVERWRITES dqkv (every element, whatever it held; a key/value head's gradient sums
// its group's query heads, deterministically) and needs D = rowsum(dout * out) per (b, h, t)
// first (attention_row_dot, into fp32 scratch of B*NH*T floats). Same stream conventions as
// the other launchers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// True when the tensor-core kernels handle this call: bf16, HS 64 or 128, 16-byte aligned tensors.
// (CudaOps sends other head sizes that are multiples of 8 up to 128 to them too, zero-padded, and
// on Hopper up to 256: flash_padded_head_size; the launchers send head size 256 to the Hopper
// kernels.) `scale`, where given (> 0), is the softmax scale in place of 1/sqrt(HS): a padded head
// keeps its own.
bool flash_attention_supported(DType dtype, int HS, const void* qkv, const void* out_or_dout, const void* dqkv);
// The head size (64, 128, or with `hopper` 256) whose kernels run a head of HS channels
// zero-padded: 0 where none does (HS not a multiple of 8, or over 128, or 256 with `hopper`).
// Padding changes no score (the padded channels add products of zeros) and gives output channels
// of 0, dropped when copied back.
int flash_padded_head_size(int HS, bool hopper = false);
// Whether head sizes 129-256 run on the Hopper kernels (padded to 256): a Hopper GPU with the
// sm_90a build, and the Hopper backward chosen (PICOTRAIN_FLASH_BACKWARD=auto or wgmma: until the
// Hopper backward has run on a GPU, those head sizes stay on the CUDA-core kernels by default).
bool flash_hopper_head_sizes();
// dst [rows][heads][dst_hs] <- src [rows][heads][src_hs] in bf16: the first min(src_hs, dst_hs)
// channels of each head copied, the rest of dst's (dst_hs > src_hs) set to 0 (attention_pad.cu).
void copy_heads_bf16(void* dst, int dst_hs, const void* src, int src_hs, size_t rows, int heads,
                     void* stream = nullptr);

// Runs the Hopper kernel where flash_forward_path() says so, else the sm_80 kernel (the backward
// below likewise, by flash_backward_path()).
void flash_attention_forward_bf16(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int HS,
                                  void* stream = nullptr, float scale = 0.0f);

// The Hopper kernels (flash_attention_forward_sm90.cu, flash_attention_backward_sm90.cu: wgmma,
// TMA, warp-specialised), the same contracts as the sm_80 kernels; they need
// flash_sm90_available(): a compute capability 9.0 GPU and a build with sm_90a code. Called by
// flash_attention_forward_bf16 and flash_attention_backward_bf16 after their argument checks.
bool flash_sm90_available();
void flash_attention_forward_sm90_bf16(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int HS,
                                       void* stream = nullptr, float scale = 0.0f);
size_t flash_backward_sm90_workspace_bytes(int B, int Tq, int Tk, int NH, int NKV, int HS);
void flash_attention_backward_sm90_bf16(void* dqkv, const void* dout, const void* qkv, const float* lse,
                                        const float* D, int B, int T, int NH, int NKV, int HS, void* workspace,
                                        void* stream = nullptr, float scale = 0.0f);
// ... and on blocks (flash_attention_block_forward_bf16's and flash_attention_block_backward_bf16's
// contracts, which call them; the forward's only on a block whose keys it does not split).
void flash_attention_block_forward_sm90_bf16(void* out, float* lse, const void* q, const void* k, const void* v, int B,
                                             int Tq, int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0,
                                             bool causal, void* stream = nullptr);
void flash_attention_block_backward_sm90_bf16(void* dq, void* dk, void* dv, const void* dout, const void* q,
                                              const void* k, const void* v, const float* lse, const float* D, int B,
                                              int Tq, int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0,
                                              bool causal, void* workspace, void* stream = nullptr);
// Which kernel the flash forward and backward run (flash_attention_paths.cpp): mma (the sm_80
// kernel everywhere), wgmma (the Hopper kernel; an error where it is not available) or automatic
// (the Hopper kernel where available). From PICOTRAIN_FLASH_FORWARD and PICOTRAIN_FLASH_BACKWARD
// = mma|wgmma|auto, each read once. Unset, the forward is auto (the Hopper forward passed
// gpu_attention on an H200, 2026-11-28) and the backward mma (the Hopper backward has not run on
// a GPU yet: gpu_attention and kernel_bench force it on). On blocks (ring attention) the forward
// takes the Hopper kernel only under wgmma, auto keeping the sm_80 one until the Hopper block
// forward has run on a GPU. Tests and benchmarks set them.
enum class FlashPath { mma, wgmma, automatic };
FlashPath flash_forward_path();
void set_flash_forward_path(FlashPath path);
FlashPath flash_backward_path();
void set_flash_backward_path(FlashPath path);
// Whether a call on `path` runs the Hopper kernel (wgmma: always, and fails where it is missing).
bool uses_sm90_kernel(FlashPath path);
// The backward's workspace (16-byte aligned, its contents don't matter): dQ (and, under GQA, dK
// and dV) partial sums and the counters that fix the order in which blocks add them
// (flash_attention_backward.cu).
size_t flash_attention_backward_workspace_bytes(int B, int T, int NH, int NKV, int HS);
void flash_attention_backward_bf16(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D,
                                   int B, int T, int NH, int NKV, int HS, void* workspace, void* stream = nullptr,
                                   float scale = 0.0f);

void attention_forward_tiled(DType dtype, void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int HS,
                             void* stream = nullptr);
void attention_backward_tiled(DType dtype, void* dqkv, const void* dout, const void* qkv, const float* lse,
                              const float* D, int B, int T, int NH, int NKV, int HS, void* stream = nullptr);

// Attention of Tq queries against Tk keys/values in separate tensors with position offsets:
// q, out [B, Tq, NH*HS], k, v [B, Tk, NKV*HS]; see Ops::attention_block_forward/backward.
// Backward ACCUMULATES into dq, dk, dv (dk/dv sum the group's query heads; each may be null: not
// wanted) and needs D = rowsum(dout * out) of the FINAL out (attention_row_dot with T = Tq). Two
// implementations:
//  - the flash kernels above, on a block (flash_attention_forward.cu, flash_attention_backward.cu
//    compute both on FlashProblem), where flash_attention_block_supported says so: bf16, head
//    size 64 or 128, at least one key, every tensor 16-byte aligned, and for the backward every
//    query seeing the block's first key when causal (q_pos0 >= k_pos0, as in ring attention's
//    blocks). With few queries (a KV cache's) the forward splits the keys over blocks and merges
//    the parts (flash-decoding): it then needs flash_attention_block_forward_workspace_bytes of
//    256-byte aligned workspace (0 when it does not split);
//  - attention_block.cu's CUDA-core kernels otherwise (f32 or bf16, any head size and offsets).
bool flash_attention_block_supported(DType dtype, int HS, int Tk, int q_pos0, int k_pos0, bool causal, bool backward,
                                     std::initializer_list<const void*> tensors);
size_t flash_attention_block_forward_workspace_bytes(int B, int Tq, int Tk, int NH, int HS);
void flash_attention_block_forward_bf16(void* out, float* lse, const void* q, const void* k, const void* v, int B,
                                        int Tq, int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0, bool causal,
                                        void* workspace, void* stream = nullptr);
size_t flash_attention_block_backward_workspace_bytes(int B, int Tq, int Tk, int NH, int NKV, int HS);
void flash_attention_block_backward_bf16(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                                         const void* v, const float* lse, const float* D, int B, int Tq, int Tk,
                                         int NH, int NKV, int HS, int q_pos0, int k_pos0, bool causal,
                                         void* workspace, void* stream = nullptr);

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
// out [B, T, NH*HS], lse [B, NH, T] <- the merge of S partial results over disjoint key ranges,
// parts [S][B, T, NH*HS] and lse_parts [S][B, NH, T]: lse = log sum_s exp(lse_s), out = sum_s
// exp(lse_s - lse) out_s (a row no part saw a key in: out 0, lse -inf).
void merge_attention_splits_gpu(DType dtype, void* out, float* lse, const void* parts, const float* lse_parts, int S,
                                int B, int T, int NH, int HS, void* stream = nullptr);

// D[b, h, t] = sum_c dout[b, t, h*HS + c] * out[b, t, h*HS + c]  (fp32), any dtype/head size.
void attention_row_dot(DType dtype, float* D, const void* dout, const void* out, int B, int T, int NH, int HS,
                       void* stream = nullptr);

// ---- FP8 attention (core/common/fp8_attention.h: the algorithm, its constants and V's layout) ----
// bf16 qkv only; head size 64 or 128; 16-byte aligned pointers (the callers check).
//
// qkv in e4m3 (attention_fp8_cast.cu fills it, flash_attention_fp8.cu reads it), with
// H = NH + 2 NKV heads per sequence numbered as in a qkv row (q heads, k heads, v heads):
struct Fp8AttentionCodes {
  float* amax = nullptr;       // [B, H]: each (sequence, head)'s largest magnitude
  float* scale_inv = nullptr;  // [B, H]: 1 / s, s = 2^fp8_scale_exponent(amax, e4m3)
  uint8_t* q = nullptr;        // [B, NH, T, HS]
  uint8_t* k = nullptr;        // [B, NKV, T, HS]
  uint8_t* vt = nullptr;       // [B, NKV, HS, Tpad]: transposed, keys permuted (fp8_attn_v_position)
};
// The bytes of those five arrays, each 256-byte aligned, and their places in `space` (as many
// bytes, 256-byte aligned).
size_t attention_fp8_codes_bytes(int B, int T, int NH, int NKV, int HS);
Fp8AttentionCodes attention_fp8_codes_at(void* space, int B, int T, int NH, int NKV, int HS);

// codes <- qkv: amax (a memset, then integer atomicMax), scale_inv and the codes, on the stream.
void attention_fp8_quantize(const Fp8AttentionCodes& codes, const void* qkv, int B, int T, int NH, int NKV, int HS,
                            void* stream = nullptr);
// qkv_dq (qkv's layout, bf16) = every value of qkv as the forward multiplies it: fp8_decode(code)
// * scale_inv, exact. amax: B * (NH + 2 NKV) floats of workspace. qkv_dq must not overlap qkv.
void attention_fp8_dequantize(void* qkv_dq, float* amax, const void* qkv, int B, int T, int NH, int NKV, int HS,
                              void* stream = nullptr);

// The FP8 flash forward (flash_attention_fp8.cu: mma.sync e4m3, sm_89+) on codes made by
// attention_fp8_quantize: out [B, T, NH HS] (bf16) and lse [B, NH, T] (f32, natural log).
// Needs flash_attention_fp8_available().
void flash_attention_fp8_forward(void* out, float* lse, const Fp8AttentionCodes& codes, int B, int T, int NH, int NKV,
                                 int HS, void* stream = nullptr);
// Whether the loaded module holds the FP8 forward's real code: a GPU of compute capability 8.9+
// and a build with code for it (sm_89, sm_90a, ...; an sm_80 build's kernel is a trap).
bool flash_attention_fp8_available();

}  // namespace pt::gpu
