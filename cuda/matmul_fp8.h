// Host interface of the FP8 product (cuda/matmul_fp8.cu) through cuBLASLt, on the MatmulContext of
// matmul_cublaslt.h (its handle, workspace and heuristic cache). Row-major tensors as in Ops;
// both operands are FP8 codes stored K-major (a [M, K], b [N, K]), each with a device f32
// scale_inv (value = code value * scale_inv). Same stream conventions as the other launchers.
#pragma once
#include "core/tensor/tensor.h"

namespace pt::gpu {

struct MatmulContext;

// out[M, N] = (a[M, K] @ b[N, K]^T) * a_scale_inv[0] * b_scale_inv[0] (+ bias[N]; may be nullptr),
// or with `accumulate` out += that (no bias). per_row: a_scale_inv [M] and b_scale_inv [N] are
// vectors, element (i, j) scaled by a_scale_inv[i] * b_scale_inv[j] (cuBLASLt's outer-vector
// scale mode: fp8_rowwise_available, which the caller checks). a_dtype / b_dtype: f8e4m3 or f8e5m2, not both e5m2;
// out_dtype (and the bias's): bf16 or f32. Products and their sum are fp32 (never cuBLASLt's FP8
// "fast accumulation"). Throws RuntimeError, naming the shape, before anything runs when cuBLASLt's
// FP8 rules are not met: K and N multiples of 16, a, b and out 16-byte aligned (M is free).
// Whether rowwise (per_row) products can run on a GPU of compute capability `major`.x: cuBLASLt's
// outer-vector scales have kernels for Hopper (9.0) and later, and this build's cuBLAS must have
// the mode (12.9+).
bool fp8_rowwise_available(int major);

void matmul_fp8(MatmulContext* ctx, DType a_dtype, DType b_dtype, DType out_dtype, void* out, const void* a,
                const float* a_scale_inv, const void* b, const float* b_scale_inv, const void* bias, int M, int N,
                int K, bool accumulate, bool per_row, void* stream = nullptr);

}  // namespace pt::gpu
