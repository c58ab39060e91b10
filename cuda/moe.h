// Host launchers for the mixture-of-experts kernels (cuda/moe.cu), callable from g++-compiled
// code: raw device pointers, activations of element type `dtype` (f32 or bf16; math in fp32),
// router probabilities and weights in f32, expert ids and slots in i32, and a cudaStream_t passed
// as void* (nullptr: the default stream). Launches are asynchronous. A bad dtype or shape throws
// RuntimeError before anything is launched. The contracts are Ops' (core/ops/ops.h).
//
// slot_of [N k] must be a permutation of [0, N k) (moe_route builds it, cuda/moe_routing.cu);
// the kernels cannot check that without a device-to-host copy, so a slot out of range is skipped
// (never an out-of-bounds access) and leaves its row unwritten or its term out of the sum.
#pragma once
#include <cstdint>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// Per row n of logits [N, E] (dtype): probs = softmax (f32), topk_expert [N, k] = the k most
// probable experts in descending order (a tie to the lower index), topk_weight [N, k] = their
// probabilities over the sum of the k (f32). 1 <= k <= E.
void moe_router_forward(DType dtype, float* probs, int32_t* topk_expert, float* topk_weight, const void* logits, int N,
                        int E, int k, void* stream = nullptr);
// dlogits [N, E] (dtype) OVERWRITTEN with the gradient through the renormalised weights and the
// softmax, given dtopk_weight [N, k] and dprobs_all [E] (Ops::moe_router_backward).
void moe_router_backward(DType dtype, void* dlogits, const float* probs, const int32_t* topk_expert,
                         const float* topk_weight, const float* dtopk_weight, const float* dprobs_all, int N, int E,
                         int k, void* stream = nullptr);
// out[slot_of[n k + j], :] = x[n, :]; out [N k, C], x [N, C].
void moe_permute(DType dtype, void* out, const void* x, const int32_t* slot_of, int N, int C, int k,
                 void* stream = nullptr);
// dx[n, :] += sum_j dout[slot_of[n k + j], :], in f32 with j in order, one rounding.
void moe_permute_backward(DType dtype, void* dx, const void* dout, const int32_t* slot_of, int N, int C, int k,
                          void* stream = nullptr);
// y[n, :] = sum_j topk_weight[n, j] expert_out[slot_of[n k + j], :], overwritten (f32 sum, j in order).
void moe_combine(DType dtype, void* y, const void* expert_out, const float* topk_weight, const int32_t* slot_of, int N,
                 int C, int k, void* stream = nullptr);
// dexpert_out[slot_of[n k + j], :] = topk_weight[n, j] dy[n, :] and dtopk_weight[n, j] =
// dot(dy[n, :], expert_out[slot_of[n k + j], :]), both overwritten; either may be nullptr.
void moe_combine_backward(DType dtype, void* dexpert_out, float* dtopk_weight, const void* dy, const void* expert_out,
                          const float* topk_weight, const int32_t* slot_of, int N, int C, int k,
                          void* stream = nullptr);

// The routing plan (cuda/moe_routing.cu): slot_of [N k] and offsets [E + 1] from topk_expert
// [N k] (Ops::moe_route); an id outside [0, E) gets slot -1 and no row.
void moe_route(int32_t* slot_of, int32_t* offsets, const int32_t* topk_expert, int N, int k, int E, void* stream);
// The balancing loss's statistics sums [2 E + 1] from probs [N, E] and offsets (Ops::moe_balance_sums),
// and from them dprobs_all [E] and, with a non-null stats [2], stats += (aux, max load) (Ops::moe_balance_loss).
void moe_balance_sums(float* sums, const float* probs, const int32_t* offsets, int N, int E, void* stream);
void moe_balance_loss(float* dprobs_all, float* stats, const float* sums, int E, int k, float aux_weight,
                      void* stream);

}  // namespace pt::gpu
