// The linear layer: out = inp @ W^T + b and its backward, through cuBLASLt, plus the bias
// gradient as our own deterministic kernel.
//
// Computes (row-major, W is [OC, IC]):
//   forward:  out[N, OC] = inp[N, IC] @ W^T + bias           (bias fused as cuBLASLt's BIAS epilogue)
//   backward: dinp[N, IC]  = dout[N, OC] @ W                  (beta = 0: overwritten, never read)
//             dW[OC, IC]  += dout^T @ inp                     (beta = 1)
//             dbias[OC]   += sum_n dout[n, :]                 (column_reduce.cuh)
// cuBLASLt is column-major; a row-major [R, S] matrix is the column-major [S, R] one, so each
// product is written for the transposed outputs:
//   out^T  (OC x N)  = op_T(W as IC x OC) * (inp as IC x N)           m=OC n=N  k=IC
//   dinp^T (IC x N)  = (W as IC x OC) * (dout as OC x N)              m=IC n=N  k=OC
//   dW^T   (IC x OC) = (inp as IC x N) * op_T(dout as OC x N)         m=IC n=OC k=N
// Precision: CUBLAS_COMPUTE_32F with fp32 scale, never the TF32 fast mode, so an fp32 run
// matches CpuOps to ~1e-6; bf16 inputs multiply exactly into fp32 accumulators. C = D in place
// with beta = 1 gives dW's "+=" for both bf16 and fp32 outputs.
// Algorithm choice: cuBLASLt's heuristic (first result) for the problem, the dtypes and the
// actual alignment of every pointer and leading dimension (odd shapes such as IC = 771 get an
// algorithm that supports them), cached per problem (a "none" answer too). Split-K reductions
// are restricted to fp32 partials in the workspace (never summed in the bf16 output), which
// also keeps them in a fixed order: cuBLASLt is then deterministic for a fixed algorithm on a
// fixed GPU; only when no such algorithm exists is any reduction scheme accepted. The bias is
// fused (BIAS epilogue) when its pointer is 16-byte aligned and an algorithm with the epilogue
// exists; else the product runs without it and a kernel adds the bias (add_bias_rows). If the
// heuristic offers nothing at all, a plain tiled CUDA-core kernel below computes the product
// (correct, slow; it warns once on stderr).
// Bias gradient: cuBLASLt's BGRADB epilogue would overwrite rather than accumulate, so it is
// our column reduction, deterministic.
//
// FLOPs: 2*N*IC*OC forward, 4*N*IC*OC backward (dinp and dW): compute-bound at training
// shapes. GPT-2 124M per step at B*T = 8192 tokens: ~6 * 8192 * 85M (matmul params) ~ 4.2
// TFLOP, ~4.3 ms at H100 SXM's 989 dense bf16 TFLOP/s; bias gradient reads N*OC*s bytes.
#include <cublasLt.h>

#include <cstdio>
#include <map>
#include <string>

#include "cuda/column_reduce.cuh"
#include "cuda/cuda_common.h"
#include "cuda/elementwise.h"
#include "cuda/matmul_cublaslt.h"

#define CUBLAS_CHECK(expr)                                                                                \
  do {                                                                                                    \
    cublasStatus_t pt_status_ = (expr);                                                                   \
    if (pt_status_ != CUBLAS_STATUS_SUCCESS)                                                              \
      throw ::pt::RuntimeError(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #expr " failed: " + \
                               cublasLtGetStatusName(pt_status_) + " (" + cublasLtGetStatusString(pt_status_) +  \
                               ")");                                                                      \
  } while (0)

namespace pt::gpu {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // Hopper's fastest kernels want 32 MiB

struct MatmulContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  struct Choice {
    bool ok = false;  // false: the heuristic offered nothing for this problem
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::string, Choice> algos;  // problem key -> the heuristic's choice
  bool warned_fallback = false;
};

namespace {

constexpr int kTile = 16;  // the fallback kernel's tile

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    default: throw RuntimeError(std::string("matmul: dtype ") + dtype_name(t) + " is not supported (f32 or bf16)");
  }
}

// Largest power of two (<= 256) dividing both the address and the leading dimension in bytes:
// every column of the matrix starts at an address this aligned.
uint32_t alignment_of(const void* p, int ld, DType t) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) | (static_cast<uintptr_t>(ld) * dtype_size(t)) | 256;
  return static_cast<uint32_t>(a & (~a + 1));
}

// A column-major product D (m x n, ld ldd) = op(A) op(B) (+ beta D) (+ bias[m]).
struct Gemm {
  bool transa, transb;
  int m, n, k;
  DType ab;  // dtype of A and B
  const void* A;
  int lda;
  const void* B;
  int ldb;
  DType cd;  // dtype of D (and of the bias)
  void* D;
  int ldd;
  float beta;
  const void* bias;  // nullptr: none
};

// Tiled CUDA-core fallback: 16 x 16 outputs per block, fp32 accumulation.
template <typename TA, typename TD>
__global__ void __launch_bounds__(kTile* kTile)
    gemm_fallback_kernel(TD* D, const TA* A, const TA* B, const TD* bias, int m, int n, int k, int lda, int ldb,
                         int ldd, bool transa, bool transb, float beta) {
  __shared__ float As[kTile][kTile + 1];  // As[kk][i] = op(A)(i, k0 + kk)
  __shared__ float Bs[kTile][kTile + 1];  // Bs[j][kk] = op(B)(k0 + kk, j)
  const int tx = threadIdx.x, ty = threadIdx.y;
  // n (the token count N in forward and dinp) runs along grid.x, whose limit is 2^31 - 1; m (a
  // channel count) along grid.y (limit 65535 blocks, i.e. m < ~1M).
  const int i = blockIdx.y * kTile + tx, j = blockIdx.x * kTile + ty;
  float acc = 0.0f;
  for (int k0 = 0; k0 < k; k0 += kTile) {
    const int ak = k0 + ty;
    As[ty][tx] = (i < m && ak < k) ? to_float(transa ? A[ak + static_cast<size_t>(i) * lda]
                                                     : A[i + static_cast<size_t>(ak) * lda])
                                   : 0.0f;
    const int bk = k0 + tx;
    Bs[ty][tx] = (bk < k && j < n) ? to_float(transb ? B[j + static_cast<size_t>(bk) * ldb]
                                                     : B[bk + static_cast<size_t>(j) * ldb])
                                   : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) acc += As[kk][tx] * Bs[ty][kk];
    __syncthreads();
  }
  if (i < m && j < n) {
    const size_t o = i + static_cast<size_t>(j) * ldd;
    float v = acc;
    if (bias) v += to_float(bias[i]);
    if (beta != 0.0f) v += beta * to_float(D[o]);
    D[o] = from_float<TD>(v);
  }
}

void gemm_fallback(const Gemm& g, cudaStream_t stream) {
  check(ceil_div(g.m, kTile) <= 65535, "matmul fallback: m = " + std::to_string(g.m) + " exceeds the grid's y limit");
  const dim3 grid(static_cast<unsigned>(ceil_div(g.n, kTile)), static_cast<unsigned>(ceil_div(g.m, kTile)));
  const dim3 block(kTile, kTile);
  dispatch_act_grad("matmul", g.ab, g.cd, [&](auto ab, auto cd) {
    using TA = decltype(ab);
    using TD = decltype(cd);
    gemm_fallback_kernel<TA, TD><<<grid, block, 0, stream>>>(
        static_cast<TD*>(g.D), static_cast<const TA*>(g.A), static_cast<const TA*>(g.B),
        static_cast<const TD*>(g.bias), g.m, g.n, g.k, g.lda, g.ldb, g.ldd, g.transa, g.transb, g.beta);
    CUDA_CHECK_LAUNCH();
  });
}

// RAII for the cuBLASLt descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Creates the operation and layout descriptors of `g`, with the BIAS epilogue when `fuse_bias`.
void make_descriptors(Descriptors& desc, const Gemm& g, bool fuse_bias) {
  const cublasOperation_t ta = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (fuse_bias) {
    // The bias vector has D's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE left at its default) and
    // D's row count m (= OC): row-major out[N, OC] is D^T, so it is added along every row of out.
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  }
  // Stored shapes: op(A) is m x k, so A is k x m when transposed; op(B) is k x n.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.a, cuda_type(g.ab), g.transa ? g.k : g.m, g.transa ? g.m : g.k, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.b, cuda_type(g.ab), g.transb ? g.n : g.k, g.transb ? g.k : g.n, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.d, cuda_type(g.cd), g.m, g.n, g.ldd));
}

// The heuristic's first algorithm for the problem in `desc`, or false when it offers none.
bool heuristic_algo(MatmulContext* ctx, Descriptors& desc, uint32_t align_a, uint32_t align_b, uint32_t align_d,
                    cublasLtMatmulAlgo_t* algo) {
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&desc.pref));
  const size_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  // Split-K partial sums only in fp32 workspace: the in-place and output-type schemes would add
  // partials in the output dtype, i.e. round to bf16 between the parts of one dot product (and
  // the in-place scheme does not fix the order of the partials).
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                    sizeof reduction));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                    sizeof align_a));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                    sizeof align_b));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                    sizeof align_d));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                    sizeof align_d));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx->handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref,
                                                     1, &result, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {  // any reduction scheme beats the fallback kernel
    const uint32_t any = CUBLASLT_REDUCTION_SCHEME_MASK;
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &any, sizeof any));
    st = cublasLtMatmulAlgoGetHeuristic(ctx->handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref, 1, &result,
                                        &found);
  }
  if (st != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS) return false;
  *algo = result.algo;
  return true;
}

void gemm(MatmulContext* ctx, const Gemm& g, cudaStream_t stream) {
  if (g.m <= 0 || g.n <= 0) return;
  if (g.k <= 0) {  // an empty sum: D = beta D (+ bias); not reached by the model
    check(g.beta == 1.0f && g.bias == nullptr, "matmul: k = 0 is only supported as a no-op accumulation");
    return;
  }
  const uint32_t align_a = alignment_of(g.A, g.lda, g.ab), align_b = alignment_of(g.B, g.ldb, g.ab);
  const uint32_t align_d = alignment_of(g.D, g.ldd, g.cd);
  // The bias goes through the BIAS epilogue when its pointer is 16-byte aligned and cuBLASLt has
  // an algorithm with that epilogue for the problem (the epilogue narrows the choice: odd shapes
  // may have a plain algorithm but no fused one); otherwise it is added by a kernel afterwards.
  for (bool fuse_bias : {true, false}) {
    if (fuse_bias && (g.bias == nullptr || !is_aligned(g.bias, 16))) continue;
    char key[256];
    std::snprintf(key, sizeof key, "%d%d %d %d %d %d%d %d %d %d %u %u %u %d %d", g.transa, g.transb, g.m, g.n, g.k,
                  int(g.ab), int(g.cd), g.lda, g.ldb, g.ldd, align_a, align_b, align_d, fuse_bias, g.beta != 0.0f);
    Descriptors desc;
    make_descriptors(desc, g, fuse_bias);
    auto it = ctx->algos.find(key);
    if (it == ctx->algos.end()) {
      MatmulContext::Choice choice;
      choice.ok = heuristic_algo(ctx, desc, align_a, align_b, align_d, &choice.algo);
      it = ctx->algos.emplace(key, choice).first;  // "none" is cached too: the heuristic is not re-asked
    }
    if (!it->second.ok) continue;
    const float alpha = 1.0f, beta = g.beta;
    CUBLAS_CHECK(cublasLtMatmul(ctx->handle, desc.op, &alpha, g.A, desc.a, g.B, desc.b, &beta, g.D, desc.d, g.D,
                                desc.d, &it->second.algo, ctx->workspace, kWorkspaceBytes, stream));
    // Row-major out[N, OC] is D^T: the bias runs along D's m dimension, i.e. along each row of out.
    if (g.bias && !fuse_bias) add_bias_rows(g.cd, g.D, g.bias, g.n, g.m, stream);
    return;
  }
  if (!ctx->warned_fallback) {
    std::fprintf(stderr,
                 "warning: cuBLASLt has no algorithm for a %s matmul m=%d n=%d k=%d (alignments %u/%u/%u bytes); "
                 "using the slow fallback kernel\n",
                 dtype_name(g.ab), g.m, g.n, g.k, align_a, align_b, align_d);
    ctx->warned_fallback = true;
  }
  gemm_fallback(g, stream);  // adds the bias itself, whatever its alignment
}

}  // namespace

MatmulContext* matmul_context_create() {
  auto* ctx = new MatmulContext;
  try {
    CUBLAS_CHECK(cublasLtCreate(&ctx->handle));
    CUDA_CHECK(cudaMalloc(&ctx->workspace, kWorkspaceBytes));
  } catch (...) {
    matmul_context_destroy(ctx);
    throw;
  }
  return ctx;
}

void matmul_context_destroy(MatmulContext* ctx) noexcept {
  if (!ctx) return;
  if (ctx->workspace) cudaFree(ctx->workspace);
  if (ctx->handle) cublasLtDestroy(ctx->handle);
  delete ctx;
}

void matmul_forward(MatmulContext* ctx, DType in_dtype, DType out_dtype, void* out, const void* inp, const void* w,
                    const void* bias, int N, int IC, int OC, void* stream) {
  gemm(ctx, Gemm{true, false, OC, N, IC, in_dtype, w, IC, inp, IC, out_dtype, out, OC, 0.0f, bias}, as_stream(stream));
}

void matmul_backward_input(MatmulContext* ctx, DType in_dtype, DType dinp_dtype, void* dinp, const void* dout,
                           const void* w, int N, int IC, int OC, void* stream) {
  gemm(ctx, Gemm{false, false, IC, N, OC, in_dtype, w, IC, dout, OC, dinp_dtype, dinp, IC, 0.0f, nullptr},
       as_stream(stream));
}

void matmul_backward_weight(MatmulContext* ctx, DType in_dtype, DType dw_dtype, void* dw, const void* dout,
                            const void* inp, int N, int IC, int OC, void* stream) {
  gemm(ctx, Gemm{false, true, IC, OC, N, in_dtype, inp, IC, dout, OC, dw_dtype, dw, IC, 1.0f, nullptr},
       as_stream(stream));
}

size_t bias_backward_scratch_bytes(int N, int OC) { return ColumnSplit(N).scratch_bytes(OC, 1); }

void bias_backward(DType dtype, DType grad_dtype, void* dbias, const void* dout, int N, int OC, void* scratch,
                   void* stream) {
  if (N <= 0 || OC <= 0 || dbias == nullptr) return;
  check(scratch != nullptr, "bias_backward: scratch is null");
  cudaStream_t s = as_stream(stream);
  const ColumnSplit split(N);
  float* partial = static_cast<float*>(scratch);
  const dim3 grid(static_cast<unsigned>(ceil_div(OC, kColumnBlock)), static_cast<unsigned>(split.chunks));
  dispatch_act_grad("bias_backward", dtype, grad_dtype, [&](auto act, auto grad) {
    using T = decltype(act);
    using G = decltype(grad);
    column_partials_kernel<T, false><<<grid, kColumnBlock, 0, s>>>(nullptr, partial, static_cast<const T*>(dout),
                                                                   nullptr, nullptr, nullptr, N, OC,
                                                                   split.rows_per_chunk);
    CUDA_CHECK_LAUNCH();
    launch_column_finalize<G>(nullptr, static_cast<G*>(dbias), nullptr, partial, split.chunks, OC, s);
  });
}

}  // namespace pt::gpu
