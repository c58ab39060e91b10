// The FP8 product of the FP8 linear layers (Ops::fp8_matmul) through cuBLASLt, tensorwise or
// rowwise scaled.
//
// Computes (row-major, both operands K-major FP8 codes, a_si / b_si their device f32 scale_inv):
//   out[M, N]  = (a[M, K] @ b[N, K]^T) * a_si * b_si (+ bias[N])     (beta 0)
//   out[M, N] += (a[M, K] @ b[N, K]^T) * a_si * b_si                  (accumulate: beta 1, C = D)
// cuBLASLt is column-major and takes FP8 only as "TN" (A transposed, B not: cublasLtMatmul's FP8
// requirements, Ada/Hopper), which is exactly the K-major layout of both operands:
//   D = out^T (N x M, ld N) = op_T(b as K x N, ld K) * op_N(a as K x M, ld K)     m=N n=M k=K
// so cuBLASLt's A is our b and its B our a: CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = b_si and
// B_SCALE_POINTER = a_si (device pointers, read when the product runs: the scales never visit the
// host). An e5m2 operand (a gradient) may be either; e5m2 x e5m2 has no cuBLASLt kernel.
// Precision: CUBLAS_COMPUTE_32F, scale type CUDA_R_32F, and CUBLASLT_MATMUL_DESC_FAST_ACCUM set
// to 0 (its default, set anyway): the tensor cores' FP8 partial sums are promoted to fp32
// periodically, as CpuOps' fp32 sum is throughout. Every product of two FP8 values is exact in
// fp32 and the scales are powers of two, so the result differs from CpuOps' only by the order of
// the fp32 sum and the one rounding to the output dtype.
// Bias: the BIAS epilogue for bf16 outputs (bias type bf16 = D's, set explicitly), when the bias
// is 16-byte aligned and the heuristic has an algorithm with it; for f32 outputs cuBLASLt's FP8
// kernels take a bf16 bias, not the f32 one Ops passes (cublasLt.h on
// CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE; the FP8 table of cublasLtMatmul), so an f32 output, and
// any output the epilogue does not fit, gets the plain product and then add_bias_rows
// (elementwise.h). For bf16 that rounds twice (the product, then the sum with the bias) where
// the epilogue rounds once: within the bf16 tolerance.
// Rowwise (per_row): a_si [M] and b_si [N] are vectors and element (i, j) is scaled by
// a_si[i] * b_si[j]: CUBLASLT_MATMUL_DESC_A_SCALE_MODE and B_SCALE_MODE =
// CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F. cublasLt.h defines that mode for A and B only: "the
// vectors are expected to have M and N elements respectively, and each (i, j)-th element of
// product of A and B is multiplied by i-th element of A scale and j-th element of B scale", M and
// N being cuBLASLt's m (rows of op(A) and D) and n (columns of D). Here m = our N and n = our M,
// so A's vector is b_si [N] and B's is a_si [M]: the same pointers as the tensorwise case, only
// longer. cublasLtMatmul's FP8 requirements add that the scale modes must be among those its
// scaling-mode table allows (outer vectors: Hopper 9.0 and later; CudaOps refuses below 9.0, and
// where a 9.0+ part still has no such kernel, e.g. consumer Blackwell 12.x, the heuristic finds
// no algorithm and the call throws naming the shape "rowwise scales") and
// that an FP8 D is not supported with OUTER_VEC_32F (our outputs are bf16 / f32). Neither source
// promises a BIAS epilogue or beta != 0 with outer-vector scales, so both are tried and, when the
// heuristic offers no algorithm: the bias by add_bias_rows after the plain product (as for f32
// outputs), and accumulate (beta 1) by the product into a stream-ordered f32 scratch
// (cudaMallocAsync) and then out += scratch elementwise (one rounding to out's dtype: CpuOps'
// o + v). The scale vectors are read by the kernel as device memory; cuBLASLt documents no
// alignment for them (ours are whole f32 tensors or slices of them).
// Restrictions, checked before anything runs (RuntimeError naming the shape): cublasLtMatmul's
// FP8 requirements ask for the "Tensor Core Usage" alignment: 16-byte aligned pointers and
// leading dimensions (here K bytes for a and b, N * 2 or 4 bytes for out). We ask, as PyTorch's
// _scaled_mm does, for K and N multiples of 16 and a, b and out 16-byte aligned; M (cuBLASLt's
// n, the columns of D) has no constraint. If the heuristic still offers no algorithm the call
// throws (there is no FP8 fallback kernel: an FP8 layer runs only where supports_fp8()).
// Algorithm choice and determinism as in matmul_cublaslt.cu: the heuristic's first algorithm for
// the problem (types, shape, epilogue, alignments, beta), cached per problem in the shared
// MatmulContext (keys start "fp8"), split-K partials only in the fp32 workspace (fixed order), so
// a fixed algorithm on a fixed GPU is bitwise repeatable.
//
// FLOPs: 2*M*N*K per call, compute-bound at training shapes. H100 SXM's dense FP8 peak is 1979
// TFLOP/s (twice bf16's 989): GPT-2 124M's qkv forward at N = 65536 tokens (M 65536, N 2304, K
// 768) is 232 GFLOP, ~0.12 ms at peak. bench/kernel_bench_fp8.cpp times it against
// matmul_forward at the same shapes.
#include <cstdio>
#include <string>
#include <utility>

#include "cuda/cuda_common.h"
#include "cuda/elementwise.h"
#include "cuda/matmul_context.h"
#include "cuda/matmul_fp8.h"

namespace pt::gpu {

namespace {

cudaDataType_t fp8_type(DType t) { return t == DType::f8e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
cudaDataType_t out_type(DType t) { return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF; }

// Largest power of two (<= 256) dividing both the address and the leading dimension in bytes
// (matmul_cublaslt.cu's rule): what the heuristic is told each matrix guarantees.
uint32_t alignment_of(const void* p, int ld, size_t elem) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p) | (static_cast<uintptr_t>(ld) * elem) | 256;
  return static_cast<uint32_t>(v & (~v + 1));
}

// One product in cuBLASLt's terms (see the header): D (m x n) = op_T(A) op_N(B) (+ beta D) (+ bias).
struct Fp8Gemm {
  DType a_dtype, b_dtype, out_dtype;  // Ops' a, b and out (cuBLASLt's B, A and D)
  void* out;
  const void* a;
  const float* a_scale_inv;
  const void* b;
  const float* b_scale_inv;
  const void* bias;  // fused (BIAS epilogue) when not null
  int M, N, K;
  bool accumulate;
  bool per_row;  // outer-vector scales: a_scale_inv [M], b_scale_inv [N]
};

void make_descriptors(Descriptors& desc, const Fp8Gemm& g) {
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int8_t fast_accum = 0;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum));
  // cuBLASLt's A is b, its B is a.
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.b_scale_inv,
                                              sizeof g.b_scale_inv));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.a_scale_inv,
                                              sizeof g.a_scale_inv));
  if (g.per_row) {
#if CUBLAS_VERSION >= 120900
    // A's vector has m = N entries (b_si), B's n = M (a_si): see the header comment.
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
#else
    throw RuntimeError("matmul_fp8: rowwise FP8 products need cuBLASLt's outer-vector scales (CUDA 12.9+); this "
                       "build's cuBLAS is " + std::to_string(CUBLAS_VERSION));
#endif
  }
  if (g.bias) {
    // bias[m] = bias[N] along every column of D, i.e. along every row of out.
    const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    const int32_t type = out_type(g.out_dtype);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  }
  // A = b stored K x N (op_T: N x K), B = a stored K x M, D = out N x M; all leading dims as stored.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.a, fp8_type(g.b_dtype), g.K, g.N, g.K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.b, fp8_type(g.a_dtype), g.K, g.M, g.K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.d, out_type(g.out_dtype), g.N, g.M, g.N));
}

// The heuristic's first algorithm for `g` (cached per problem, "none" too); false: none.
bool find_algo(MatmulContext* ctx, const Fp8Gemm& g, Descriptors& desc, cublasLtMatmulAlgo_t* algo) {
  const size_t out_elem = dtype_size(g.out_dtype);
  const uint32_t align_a = alignment_of(g.b, g.K, 1), align_b = alignment_of(g.a, g.K, 1);
  const uint32_t align_d = alignment_of(g.out, g.N, out_elem);
  const uint32_t align_v = g.bias ? alignment_of(g.bias, 0, out_elem) : 0;
  char key[256];
  std::snprintf(key, sizeof key, "fp8 %d%d%d %d %d %d %u %u %u %u %d %d", int(g.a_dtype), int(g.b_dtype),
                int(g.out_dtype), g.M, g.N, g.K, align_a, align_b, align_d, align_v, int(g.accumulate),
                int(g.per_row));
  auto it = ctx->algos.find(key);
  if (it == ctx->algos.end()) {
    MatmulContext::Choice choice;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&desc.pref));
    const size_t ws = kWorkspaceBytes;
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    // Split-K partials only in the fp32 workspace, in a fixed order (matmul_cublaslt.cu).
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                      &reduction, sizeof reduction));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
    for (const auto& [attr, value] : aligns)
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, attr, &value, sizeof value));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx->handle, desc.op, desc.a, desc.b, desc.d, desc.d,
                                                       desc.pref, 1, &result, &found);
    if (!g.bias && (st != CUBLAS_STATUS_SUCCESS || found == 0)) {
      // The plain product has no alternative: any reduction scheme beats failing (as for the
      // plain bf16 product's last resort in matmul_cublaslt.cu).
      const uint32_t any = CUBLASLT_REDUCTION_SCHEME_MASK;
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &any,
                                                        sizeof any));
      st = cublasLtMatmulAlgoGetHeuristic(ctx->handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref, 1,
                                          &result, &found);
    }
    choice.ok = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (choice.ok) choice.algo = result.algo;
    it = ctx->algos.emplace(key, choice).first;
  }
  if (it->second.ok) *algo = it->second.algo;
  return it->second.ok;
}

// Runs `g` through cuBLASLt if the heuristic has an algorithm for it; false: nothing ran.
bool run_fp8(MatmulContext* ctx, const Fp8Gemm& g, cudaStream_t stream) {
  Descriptors desc;
  make_descriptors(desc, g);
  cublasLtMatmulAlgo_t algo{};
  if (!find_algo(ctx, g, desc, &algo)) return false;
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(ctx->handle, desc.op, &alpha, g.b, desc.a, g.a, desc.b, &beta, g.out, desc.d, g.out,
                              desc.d, &algo, ctx->workspace, kWorkspaceBytes, stream));
  return true;
}

std::string shape_of(const Fp8Gemm& g) {
  return "M=" + std::to_string(g.M) + " N=" + std::to_string(g.N) + " K=" + std::to_string(g.K) + " (a " +
         dtype_name(g.a_dtype) + ", b " + dtype_name(g.b_dtype) + ", out " + dtype_name(g.out_dtype) +
         (g.per_row ? ", rowwise scales" : "") + ")";
}

// out[i] += add[i] (f32), one rounding to out's type: the rowwise accumulate fallback.
template <typename T>
__global__ void add_f32_kernel(T* out, const float* add, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<T>(static_cast<float>(out[i]) + add[i]);
}

void add_f32(DType out_dtype, void* out, const float* add, size_t n, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const size_t blocks = ceil_div(n, size_t(kThreads));
  check(blocks <= 0x7fffffffu, "matmul_fp8: " + std::to_string(n) + " elements exceed one launch's grid");
  if (out_dtype == DType::f32)
    add_f32_kernel<float><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<float*>(out), add, n);
  else
    add_f32_kernel<__nv_bfloat16>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(out), add, n);
  CUDA_CHECK_LAUNCH();
}

// Rowwise accumulate without a beta = 1 algorithm: the product into an f32 scratch, then out +=.
bool run_fp8_accumulate_via_scratch(MatmulContext* ctx, const Fp8Gemm& g, cudaStream_t stream) {
  const size_t n = size_t(g.M) * g.N;
  void* tmp = nullptr;
  CUDA_CHECK(cudaMallocAsync(&tmp, n * sizeof(float), stream));
  Fp8Gemm p = g;
  p.out = tmp;
  p.out_dtype = DType::f32;
  p.accumulate = false;
  p.bias = nullptr;
  bool ok = false;
  try {
    ok = run_fp8(ctx, p, stream);
    if (ok) add_f32(g.out_dtype, g.out, static_cast<const float*>(tmp), n, stream);
  } catch (...) {
    cudaFreeAsync(tmp, stream);
    throw;
  }
  CUDA_CHECK(cudaFreeAsync(tmp, stream));
  return ok;
}

}  // namespace

bool fp8_rowwise_available(int major) {
#if CUBLAS_VERSION >= 120900
  return major >= 9;
#else
  (void)major;
  return false;
#endif
}

void matmul_fp8(MatmulContext* ctx, DType a_dtype, DType b_dtype, DType out_dtype, void* out, const void* a,
                const float* a_scale_inv, const void* b, const float* b_scale_inv, const void* bias, int M, int N,
                int K, bool accumulate, bool per_row, void* stream) {
  const auto is_fp8 = [](DType t) { return t == DType::f8e4m3 || t == DType::f8e5m2; };
  Fp8Gemm g{a_dtype, b_dtype, out_dtype, out, a, a_scale_inv, b, b_scale_inv, bias, M, N, K, accumulate, per_row};
  check(is_fp8(a_dtype) && is_fp8(b_dtype) && !(a_dtype == DType::f8e5m2 && b_dtype == DType::f8e5m2),
        "matmul_fp8: " + shape_of(g) + ": operands must be f8e4m3 or f8e5m2, not both f8e5m2");
  check(out_dtype == DType::bf16 || out_dtype == DType::f32,
        "matmul_fp8: " + shape_of(g) + ": out must be bf16 or f32");
  check(M >= 0 && N >= 0 && K >= 0, "matmul_fp8: " + shape_of(g) + ": negative dimension");
  check(!(accumulate && bias), "matmul_fp8: " + shape_of(g) + ": a bias with accumulate is not supported");
  if (M == 0 || N == 0) return;
  check(K % 16 == 0 && N % 16 == 0,
        "matmul_fp8: " + shape_of(g) + ": cuBLASLt's FP8 products need K and N to be multiples of 16");
  check(is_aligned(a, 16) && is_aligned(b, 16) && is_aligned(out, 16),
        "matmul_fp8: " + shape_of(g) + ": cuBLASLt's FP8 products need a, b and out 16-byte aligned");
  cudaStream_t s = as_stream(stream);
  if (K == 0) {  // an empty sum: out = 0 (+ bias), or out unchanged; not reached by the model
    if (accumulate) return;
    CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(M) * N * dtype_size(out_dtype), s));
    if (bias) add_bias_rows(out_dtype, out, bias, M, N, s);
    return;
  }
  // The fused bias (bf16 only: see the header), else the plain product and add_bias_rows.
  if (bias && out_dtype == DType::bf16 && is_aligned(bias, 16) && run_fp8(ctx, g, s)) return;
  g.bias = nullptr;
  if (run_fp8(ctx, g, s)) {
    if (bias) add_bias_rows(out_dtype, out, bias, M, N, s);
    return;
  }
  // Rowwise accumulate: cuBLASLt may have no outer-vector kernel with beta = 1 (see the header).
  if (per_row && accumulate && run_fp8_accumulate_via_scratch(ctx, g, s)) return;
  throw RuntimeError("matmul_fp8: cuBLASLt has no FP8 algorithm for " + shape_of(g) +
                     (accumulate ? " accumulating" : "") + " on this GPU");
}

}  // namespace pt::gpu
