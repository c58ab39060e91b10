// Host interface of the linear layer on the GPU (cuda/matmul_cublaslt.cu): matrix products
// through cuBLASLt; the bias gradient from the weight gradient's product (cuBLASLt's BGRADB
// epilogue) or our own deterministic column reduction; the MLP's GELU fused into its products
// (GELU epilogues) or run by cuda/gelu.cu. Row-major tensors as in Ops (a weight is
// [OC, IC]); `in_dtype` is the dtype of the inputs and weights (f32 or bf16), the
// output/gradient dtype may be the same or f32 (bf16 inputs with fp32 weight gradients).
// Accumulation is always fp32 (CUBLAS_COMPUTE_32F; never TF32, so fp32 mode matches the CPU
// reference to ~1e-6). Same stream conventions as the other launchers.
#pragma once
#include <cstddef>
#include <string>

#include "core/ops/matmul_algos.h"

#include "core/tensor/tensor.h"

namespace pt::gpu {

// The cuBLASLt handle, its 32 MiB workspaces and a cache of the heuristic's algorithm choices.
// Two lanes, each with its own workspace, let two products run at once on two streams: lane 0
// (every call's by default) and lane 1 (CudaOps' side stream, matmul_backward's dW beside dinp).
struct MatmulContext;
MatmulContext* matmul_context_create();
void matmul_context_destroy(MatmulContext* ctx) noexcept;

// precision.matmul_algos (core/ops/matmul_algos.h), as Ops declares them: the library and GPU
// the choices hold for; start timing the products not seen yet; what the timing found; run the
// given algorithms from now on (and stop timing). bf16/fp32 products only (FP8's keep the
// heuristic's).
std::string matmul_library(const MatmulContext* ctx);
void matmul_start_timing(MatmulContext* ctx);
MatmulAlgos matmul_timed_algos(const MatmulContext* ctx);
bool matmul_timing(const MatmulContext* ctx);  // timing is on: no products side by side
void matmul_use_algos(MatmulContext* ctx, const MatmulAlgos& algos);

// out[N, OC] = inp[N, IC] @ w[OC, IC]^T (+ bias[OC]; bias may be nullptr). out and bias are out_dtype.
void matmul_forward(MatmulContext* ctx, DType in_dtype, DType out_dtype, void* out, const void* inp, const void* w,
                    const void* bias, int N, int IC, int OC, void* stream = nullptr);
// dinp[N, IC] = dout[N, OC] @ w[OC, IC]   (overwritten; dinp is dinp_dtype)
void matmul_backward_input(MatmulContext* ctx, DType in_dtype, DType dinp_dtype, void* dinp, const void* dout,
                           const void* w, int N, int IC, int OC, void* stream = nullptr);
// dw[OC, IC] += dout[N, OC]^T @ inp[N, IC]   (dw is dw_dtype)
// and, when dbias is not null, dbias[OC] += sum_n dout[n, :]   (dbias is dbias_dtype), from the same
// product where cuBLASLt can (its BGRADB epilogue), else as bias_backward. `scratch` holds
// bias_backward_scratch_bytes(N, OC) when dbias is not null.
void matmul_backward_weight(MatmulContext* ctx, DType in_dtype, DType dw_dtype, void* dw, DType dbias_dtype,
                            void* dbias, const void* dout, const void* inp, int N, int IC, int OC, void* scratch,
                            void* stream = nullptr, int lane = 0);

// The MLP's fc layer and its GELU (Ops::matmul_gelu_forward), all tensors of `dtype`:
// out_pre[N, OC] = inp[N, IC] @ w[OC, IC]^T (+ bias[OC]; may be nullptr), out = gelu(out_pre),
// both overwritten. bf16 products whose shape cuBLASLt takes run as one call with the
// GELU_AUX(_BIAS) epilogue (out_pre is its aux output); the rest as matmul_forward + gelu_forward.
void matmul_gelu_forward(MatmulContext* ctx, DType dtype, void* out, void* out_pre, const void* inp, const void* w,
                         const void* bias, int N, int IC, int OC, void* stream = nullptr);
// The fc projection's input gradient through the GELU (Ops::matmul_backward_input_dgelu):
// dpre[N, IC] = gelu'(pre[N, IC]) * (dout[N, OC] @ w[OC, IC]), overwritten; one call with the
// DGELU epilogue (pre is its aux input) where it fits as above, else matmul_backward_input +
// gelu_backward.
void matmul_backward_input_dgelu(MatmulContext* ctx, DType dtype, void* dpre, const void* dout, const void* w,
                                 const void* pre, int N, int IC, int OC, void* stream = nullptr);

// dbias[OC] += sum_n dout[n, :] alone, deterministic (fp32 partial sums in `scratch`, then an
// ordered pass: cuda/column_reduce.cuh).
size_t bias_backward_scratch_bytes(int N, int OC);
void bias_backward(DType dtype, DType grad_dtype, void* dbias, const void* dout, int N, int OC, void* scratch,
                   void* stream = nullptr);

}  // namespace pt::gpu
