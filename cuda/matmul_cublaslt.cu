// The linear layer: out = inp @ W^T + b and its backward, through cuBLASLt; the bias gradient
// from the weight gradient's product (cuBLASLt's BGRADB epilogue) or our own column reduction;
// the MLP's GELU fused into its two products (GELU epilogues) or run after them.
//
// Computes (row-major, W is [OC, IC]):
//   forward:  out[N, OC] = inp[N, IC] @ W^T + bias           (bias fused as cuBLASLt's BIAS epilogue)
//   backward: dinp[N, IC]  = dout[N, OC] @ W                  (beta = 0: overwritten, never read)
//             dW[OC, IC]  += dout^T @ inp                     (beta = 1)
//             dbias[OC]   += sum_n dout[n, :]                 (with dW: BGRADB; else column_reduce.cuh)
//   MLP fc:   pre = inp @ W^T + bias, out = gelu(pre)         (GELU_AUX_BIAS: pre is the aux output)
//   fc proj:  dpre = (dout @ W) * gelu'(pre)                  (DGELU: pre is the aux input)
// cuBLASLt is column-major; a row-major [R, S] matrix is the column-major [S, R] one, so each
// product is written for the transposed outputs:
//   out^T  (OC x N)  = op_T(W as IC x OC) * (inp as IC x N)           m=OC n=N  k=IC
//   dinp^T (IC x N)  = (W as IC x OC) * (dout as OC x N)              m=IC n=N  k=OC
//   dW^T   (IC x OC) = (inp as IC x N) * op_T(dout as OC x N)         m=IC n=OC k=N
// Precision: CUBLAS_COMPUTE_32F with fp32 scale, never the TF32 fast mode, so an fp32 run
// matches CpuOps to ~1e-6; bf16 inputs multiply exactly into fp32 accumulators. C = D in place
// with beta = 1 gives dW's "+=" for both bf16 and fp32 outputs.
// Algorithm choice: cuBLASLt's heuristic (first result) for the problem, the dtypes, the
// epilogue and the actual alignment of every pointer and leading dimension (odd shapes such as
// IC = 771 get an algorithm that supports them), cached per problem (a "none" answer too).
// Split-K reductions are restricted to fp32 partials in the workspace (never summed in the bf16
// output), which also keeps them in a fixed order: cuBLASLt is then deterministic for a fixed
// algorithm on a fixed GPU. Only for the plain product, when no such algorithm exists, is any
// reduction scheme accepted (its alternative is the slow kernel below; an epilogue's is the
// plain product plus a deterministic kernel of ours). The bias is fused (BIAS epilogue) when its
// pointer is 16-byte aligned and an algorithm with the epilogue exists; else the product runs
// without it and a kernel adds the bias (add_bias_rows). If the heuristic offers nothing at all,
// a plain tiled CUDA-core kernel below computes the product (correct, slow; it warns once).
// Bias gradient: in the dW product B is dout (op(B) = dout as N x OC, k = N), so BGRADB, the
// sums of op(B) over k, one per column of D (cublasLt.h), is sum_n dout[n, :], and it comes out
// of the same cuBLASLt call: no pass of ours over dout. The epilogue overwrites its vector (of
// D's type by default) while dbias accumulates over micro-batches, so it writes fp32
// (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = CUDA_R_32F) into scratch and launch_column_finalize,
// with one chunk, adds those OC sums into dbias (f32 or bf16). It runs under the dW product's
// algorithm and reduction rule, so it is as repeatable. When there is no dW, or the heuristic
// has no algorithm with the epilogue for the problem (cached as above), the product runs plain
// and dbias comes from the column reduction (column_reduce.cuh: 16-byte loads, per-chunk fp32
// partials, fixed order).
// GELU epilogues (the MLP's fc layer forward, the fc projection's input gradient): cuBLASLt's
// GELU is GPT-2's tanh form (cublasLt.h does not say; the expected output of a cuBLASLt GELU
// epilogue test in LLVM's SYCL migration suite, gelu(-1) = -0.158806, is the tanh form's
// -0.158808, not erf's -0.158655; test/gpu_ops.cpp checks against CpuOps). The forward writes pre as the aux matrix and gelu(pre) as D;
// backward reads pre as aux and scales the product by gelu'(pre) before its one rounding. The
// aux matrix has D's dtype and leading dimension (a multiple of 8, cublasLt.h) and its pointer's
// alignment is part of the cached problem. Used for bf16 only (gelu_epilogue_fits), under the
// split-K rule above; where the heuristic offers no algorithm (odd OC or IC, misaligned
// pointers), or in fp32, the plain product runs and cuda/gelu.cu's kernel follows it. Either way
// deterministic. The forward applies GELU to the fp32 sum, the two-step path to its bf16
// rounding, so their bf16 outputs can differ by a rounding (Ops::matmul_gelu_forward).
//
// Streams: every call runs on the stream it is given, with the workspace of its lane
// (matmul_cublaslt.h): CudaOps runs the dW product on a side stream (lane 1) beside dinp's.
// FLOPs: 2*N*IC*OC forward, 4*N*IC*OC backward (dinp and dW): compute-bound at training
// shapes. GPT-2 124M per step at B*T = 8192 tokens: ~6 * 8192 * 85M (matmul params) ~ 4.2
// TFLOP, ~4.3 ms at H100 SXM's 989 dense bf16 TFLOP/s.
// Bias gradient bytes: through BGRADB, 4*OC written and read back plus dbias read and written
// (KBs); through the column reduction, dout once more (N*OC*s: 403 MB at N = 65536, OC = 3072,
// bf16, ~85 us at H200's 4.8 TB/s) plus 8*chunks*OC of partials (chunks <= 256).
// GELU bytes saved per call (n = N*4C, s = 2 for bf16; n*s = 403 MB at GPT-2 124M, N = 65536):
// forward 3ns -> 2ns (pre and out written; the GELU pass's read of pre is gone); backward
// 4ns -> 2ns (the product reads pre and writes dpre; dinp's write and read back are gone).
// What the epilogue costs the product itself is measured (bench/kernel_bench_model.cpp, "fc + gelu").
#include <cublasLt.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "cuda/column_reduce.cuh"
#include "cuda/cuda_common.h"
#include "cuda/elementwise.h"
#include "cuda/gelu.h"
#include "cuda/matmul_algo_timing.h"
#include "cuda/matmul_context.h"
#include "cuda/matmul_cublaslt.h"

namespace pt::gpu {

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
  const void* bias;   // bias[m] added to D (forward); nullptr: none
  float* bias_grad;   // the BGRADB epilogue's output (backward, see Epilogue); nullptr: none
  const void* aux = nullptr;  // the GELU epilogues' m x n matrix (D's dtype and ld): GELU's input
  void* workspace = nullptr;   // cuBLASLt's workspace: ctx->workspace when null (matmul_cublaslt.h, lanes)
};

// What a cuBLASLt product does besides D = op(A) op(B) + beta D.
enum class Epilogue {
  none,
  bias,    // D += bias[m] along every column (BIAS): the forward's bias
  bgradb,  // bias_grad[j] = sum_k op(B)(k, j), n fp32 values, overwritten (BGRADB): the bias gradient
  gelu_aux,       // aux = D, then D = gelu(D) (GELU_AUX): the MLP's fc layer without a bias
  gelu_aux_bias,  // aux = D + bias[m], then D = gelu(aux) (GELU_AUX_BIAS): the fc layer with one
  dgelu,          // D = D * gelu'(aux) (DGELU): the fc projection's input gradient through the GELU
};

bool uses_aux(Epilogue e) { return e == Epilogue::gelu_aux || e == Epilogue::gelu_aux_bias || e == Epilogue::dgelu; }

// Whether the GELU epilogues are tried at all (else matmul_gelu_forward and
// matmul_backward_input_dgelu always run the product and cuda/gelu.cu's kernel): the switch
// for timing both (bench/kernel_bench_model.cpp's "fc + gelu" rows) and for turning either off.
constexpr bool kGeluEpilogueForward = true;
constexpr bool kGeluEpilogueBackward = true;

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

// Creates the operation and layout descriptors of `g` with epilogue `epi`.
void make_descriptors(Descriptors& desc, const Gemm& g, Epilogue epi) {
  const cublasOperation_t ta = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (epi == Epilogue::bias) {
    // The bias vector has D's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE left at its default) and
    // D's row count m (= OC): row-major out[N, OC] is D^T, so it is added along every row of out.
    const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  } else if (epi == Epilogue::bgradb) {
    // The gradient vector's type defaults to D's; it is asked for in fp32 whatever D is, so that
    // a bf16 dW does not round the sum before it is added to dbias. Where the library does not
    // support that, the heuristic offers no algorithm and the caller falls back.
    const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BGRADB;
    const int32_t type = CUDA_R_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias_grad,
                                                sizeof g.bias_grad));
  } else if (uses_aux(epi)) {
    // The aux matrix (written forward, read backward) is laid out as D: its dtype is D's
    // (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE left at its default) and so is its leading
    // dimension, which cublasLt.h requires to be a multiple of 8 (gelu_epilogue_fits checks).
    const cublasLtEpilogue_t e = epi == Epilogue::dgelu        ? CUBLASLT_EPILOGUE_DGELU
                                 : epi == Epilogue::gelu_aux_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                  : CUBLASLT_EPILOGUE_GELU_AUX;
    const int64_t ld = g.ldd;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    if (epi == Epilogue::gelu_aux_bias)
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux,
                                                sizeof g.aux));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  // Stored shapes: op(A) is m x k, so A is k x m when transposed; op(B) is k x n.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.a, cuda_type(g.ab), g.transa ? g.k : g.m, g.transa ? g.m : g.k, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.b, cuda_type(g.ab), g.transb ? g.n : g.k, g.transb ? g.k : g.n, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.d, cuda_type(g.cd), g.m, g.n, g.ldd));
}

// The heuristic's first algorithm for the problem in `desc`, or false when it offers none.
// `last_resort`: the caller's only alternative is the fallback kernel, so when no algorithm with
// the deterministic reduction scheme exists, any scheme is accepted.
bool heuristic_algo(MatmulContext* ctx, Descriptors& desc, uint32_t align_a, uint32_t align_b, uint32_t align_d,
                    bool last_resort, cublasLtMatmulAlgo_t* algo) {
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
  if (last_resort && (st != CUBLAS_STATUS_SUCCESS || found == 0)) {  // any reduction scheme beats the fallback kernel
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

// The algorithm use_matmul_algos gave for `key`, if any and the library accepts it for the
// problem in `desc` (a refusal warns once; the heuristic chooses instead).
bool take_given_algo(MatmulContext* ctx, Descriptors& desc, const char* key, cublasLtMatmulAlgo_t* algo) {
  const auto given = ctx->given.find(key);
  if (given == ctx->given.end()) return false;
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t st =
      cublasLtMatmulAlgoCheck(ctx->handle, desc.op, desc.a, desc.b, desc.d, desc.d, &given->second, &check);
  const bool ok = st == CUBLAS_STATUS_SUCCESS && check.state == CUBLAS_STATUS_SUCCESS &&
                  check.workspaceSize <= kWorkspaceBytes;
  if (ok) *algo = given->second;
  if (!ok && !ctx->warned_given) {
    std::fprintf(stderr, "warning: cuBLASLt refuses the matmul algorithm precision.matmul_algos gave for product "
                         "\"%s\" (%s); its heuristic chooses instead, so results may differ in the last bits from "
                         "the run that timed it\n", key, cublasLtGetStatusName(st != CUBLAS_STATUS_SUCCESS ? st : check.state));
    ctx->warned_given = true;
  }
  ctx->given.erase(given);
  return ok;
}

// precision.matmul_algos = "timed": times the candidates for the product `g` (whose heuristic
// choice is `first`) and records the fastest under `key` in ctx->timed. Its outputs go to
// scratch: D, and the aux matrix when the epilogue writes it (GELU_AUX).
void time_product(MatmulContext* ctx, Descriptors& desc, const Gemm& g, Epilogue epi, const char* key,
                  const cublasLtMatmulAlgo_t& first, cudaStream_t stream) {
  const bool writes_aux = epi == Epilogue::gelu_aux || epi == Epilogue::gelu_aux_bias;
  const size_t d_bytes = (size_t(g.ldd) * (g.n - 1) + g.m) * dtype_size(g.cd);
  const TimedProduct p{g.A, g.B, g.beta, d_bytes, writes_aux ? const_cast<void*>(g.aux) : nullptr,
                       writes_aux ? d_bytes : 0, g.workspace ? g.workspace : ctx->workspace};
  const TimedChoice t = time_candidates(ctx, desc, p, first, stream);
  if (!t.ok) return;  // untimed: the product keeps the heuristic's choice, and is not listed
  MatmulAlgos& m = ctx->timed;
  m.chosen[key] = algo_hex(t.fastest);
  const bool differs = std::memcmp(&t.fastest, &first, sizeof first) != 0;
  m.differs += differs;
  m.heuristic_us += t.first_us >= 0 ? t.first_us : t.fastest_us;
  m.chosen_us += t.fastest_us;
}

// Runs `g` with epilogue `epi` through cuBLASLt if the heuristic has an algorithm for it; false:
// nothing ran. The heuristic is asked once per problem and its answer cached ("none" too).
bool run_cublaslt(MatmulContext* ctx, const Gemm& g, Epilogue epi, cudaStream_t stream) {
  const uint32_t align_a = alignment_of(g.A, g.lda, g.ab), align_b = alignment_of(g.B, g.ldb, g.ab);
  const uint32_t align_d = alignment_of(g.D, g.ldd, g.cd);
  // The heuristic also reads the epilogue's vector and aux pointers, for their alignment
  // (cublasLt.h on CUBLASLT_MATMUL_DESC_BIAS_POINTER and _EPILOGUE_AUX_POINTER), so those
  // alignments are part of the problem (256 and 0: no such pointer).
  const void* vec = epi == Epilogue::bias || epi == Epilogue::gelu_aux_bias ? g.bias
                    : epi == Epilogue::bgradb                                ? g.bias_grad
                                                                             : nullptr;
  const uint32_t align_v = alignment_of(vec, 0, g.cd);
  const uint32_t align_x = uses_aux(epi) ? alignment_of(g.aux, g.ldd, g.cd) : 0;
  char key[256];
  std::snprintf(key, sizeof key, "%d%d %d %d %d %d%d %d %d %d %u %u %u %d %u %u %d", g.transa, g.transb, g.m, g.n,
                g.k, int(g.ab), int(g.cd), g.lda, g.ldb, g.ldd, align_a, align_b, align_d, int(epi), align_v, align_x,
                g.beta != 0.0f);
  Descriptors desc;
  make_descriptors(desc, g, epi);
  auto it = ctx->algos.find(key);
  if (it == ctx->algos.end()) {
    MatmulContext::Choice choice;
    if (!take_given_algo(ctx, desc, key, &choice.algo)) {
      // Only the plain product is a last resort: an epilogue's alternative is the plain product
      // plus a deterministic kernel (add_bias_rows, the column reduction, the GELU kernels).
      choice.ok = heuristic_algo(ctx, desc, align_a, align_b, align_d, epi == Epilogue::none, &choice.algo);
      if (choice.ok && ctx->timing) time_product(ctx, desc, g, epi, key, choice.algo, stream);
    } else {
      choice.ok = true;
    }
    it = ctx->algos.emplace(key, choice).first;
  }
  if (!it->second.ok) return false;
  const float alpha = 1.0f, beta = g.beta;
  CUBLAS_CHECK(cublasLtMatmul(ctx->handle, desc.op, &alpha, g.A, desc.a, g.B, desc.b, &beta, g.D, desc.d, g.D, desc.d,
                              &it->second.algo, g.workspace ? g.workspace : ctx->workspace, kWorkspaceBytes,
                              stream));
  return true;
}

// D = op(A) op(B) (+ beta D) (+ bias) of `g` (its bias_grad is not used): through cuBLASLt, else
// the fallback kernel.
void gemm(MatmulContext* ctx, const Gemm& g, cudaStream_t stream) {
  if (g.m <= 0 || g.n <= 0) return;
  if (g.k <= 0) {  // an empty sum: D = beta D (+ bias); not reached by the model
    check(g.beta == 1.0f && g.bias == nullptr, "matmul: k = 0 is only supported as a no-op accumulation");
    return;
  }
  // The bias goes through the BIAS epilogue when its pointer is 16-byte aligned and cuBLASLt has
  // an algorithm with that epilogue for the problem (the epilogue narrows the choice: odd shapes
  // may have a plain algorithm but no fused one); otherwise it is added by a kernel afterwards.
  if (g.bias && is_aligned(g.bias, 16) && run_cublaslt(ctx, g, Epilogue::bias, stream)) return;
  if (run_cublaslt(ctx, g, Epilogue::none, stream)) {
    // Row-major out[N, OC] is D^T: the bias runs along D's m dimension, i.e. along each row of out.
    if (g.bias) add_bias_rows(g.cd, g.D, g.bias, g.n, g.m, stream);
    return;
  }
  if (!ctx->warned_fallback) {
    std::fprintf(stderr,
                 "warning: cuBLASLt has no algorithm for a %s matmul m=%d n=%d k=%d (alignments %u/%u/%u bytes); "
                 "using the slow fallback kernel\n",
                 dtype_name(g.ab), g.m, g.n, g.k, alignment_of(g.A, g.lda, g.ab), alignment_of(g.B, g.ldb, g.ab),
                 alignment_of(g.D, g.ldd, g.cd));
    ctx->warned_fallback = true;
  }
  gemm_fallback(g, stream);  // adds the bias itself, whatever its alignment
}

// Whether `g` may try a GELU epilogue (`enabled`: its kGeluEpilogue* switch): bf16 only, so
// that fp32 mode keeps cuda/gelu.cu's GELU, which matches CpuOps to ~1e-6 (cuBLASLt states no
// accuracy for its own); a non-empty product; the aux leading dimension (D's) a multiple of 8
// (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD).
bool gelu_epilogue_fits(bool enabled, const Gemm& g) {
  return enabled && g.ab == DType::bf16 && g.cd == DType::bf16 && g.m > 0 && g.n > 0 && g.k > 0 && g.ldd % 8 == 0;
}

}  // namespace

MatmulContext* matmul_context_create() {
  auto* ctx = new MatmulContext;
  try {
    CUBLAS_CHECK(cublasLtCreate(&ctx->handle));
    CUDA_CHECK(cudaMalloc(&ctx->workspace, kWorkspaceBytes));
    CUDA_CHECK(cudaMalloc(&ctx->side_workspace, kWorkspaceBytes));
    ctx->library = matmul_library_name();
  } catch (...) {
    matmul_context_destroy(ctx);
    throw;
  }
  return ctx;
}

std::string matmul_library(const MatmulContext* ctx) { return ctx->library; }

void matmul_start_timing(MatmulContext* ctx) {
  ctx->timing = true;
  ctx->timed.library = ctx->library;
}

MatmulAlgos matmul_timed_algos(const MatmulContext* ctx) { return ctx->timed; }

bool matmul_timing(const MatmulContext* ctx) { return ctx->timing; }

void matmul_use_algos(MatmulContext* ctx, const MatmulAlgos& algos) {
  check(algos.library == ctx->library, "matmul_use_algos: choices made on " + algos.library + ", not here");
  ctx->timing = false;
  // Every product resolves again at its next call: a listed one takes (and checks) its algorithm,
  // any other asks the heuristic, which answers as it did before.
  ctx->algos.clear();
  ctx->given.clear();
  for (const auto& [key, hex] : algos.chosen) {
    cublasLtMatmulAlgo_t algo{};
    check(algo_from_hex(hex, &algo), "matmul_use_algos: product \"" + key + "\" has no algorithm's bytes");
    ctx->given[key] = algo;
  }
}

void matmul_context_destroy(MatmulContext* ctx) noexcept {
  if (!ctx) return;
  if (ctx->workspace) cudaFree(ctx->workspace);
  if (ctx->side_workspace) cudaFree(ctx->side_workspace);
  if (ctx->handle) cublasLtDestroy(ctx->handle);
  delete ctx;
}

void matmul_forward(MatmulContext* ctx, DType in_dtype, DType out_dtype, void* out, const void* inp, const void* w,
                    const void* bias, int N, int IC, int OC, void* stream) {
  gemm(ctx, Gemm{true, false, OC, N, IC, in_dtype, w, IC, inp, IC, out_dtype, out, OC, 0.0f, bias, nullptr},
       as_stream(stream));
}

void matmul_backward_input(MatmulContext* ctx, DType in_dtype, DType dinp_dtype, void* dinp, const void* dout,
                           const void* w, int N, int IC, int OC, void* stream) {
  gemm(ctx, Gemm{false, false, IC, N, OC, in_dtype, w, IC, dout, OC, dinp_dtype, dinp, IC, 0.0f, nullptr, nullptr},
       as_stream(stream));
}

void matmul_backward_weight(MatmulContext* ctx, DType in_dtype, DType dw_dtype, void* dw, DType dbias_dtype,
                            void* dbias, const void* dout, const void* inp, int N, int IC, int OC, void* scratch,
                            void* stream, int lane) {
  cudaStream_t s = as_stream(stream);
  if (dbias) check_act_grad("matmul_backward_weight", in_dtype, dbias_dtype);  // refused before dW changes
  // The BGRADB epilogue overwrites its output while dbias accumulates: it writes fp32 sums to
  // scratch, which one small pass adds to dbias.
  float* sums = dbias ? static_cast<float*>(scratch) : nullptr;
  Gemm g{false, true, IC, OC, N, in_dtype, inp, IC, dout, OC, dw_dtype, dw, IC, 1.0f, nullptr, sums};
  if (lane == 1) g.workspace = ctx->side_workspace;
  if (sums && N > 0 && IC > 0 && OC > 0 && run_cublaslt(ctx, g, Epilogue::bgradb, s)) {
    dispatch_act_grad("matmul_backward_weight", in_dtype, dbias_dtype, [&](auto, auto grad) {
      using G = decltype(grad);
      launch_column_finalize<G>(nullptr, static_cast<G*>(dbias), nullptr, sums, 1, OC, s);
    });
    return;
  }
  gemm(ctx, g, s);
  bias_backward(in_dtype, dbias_dtype, dbias, dout, N, OC, scratch, stream);  // returns at once without dbias
}

void matmul_gelu_forward(MatmulContext* ctx, DType dtype, void* out, void* out_pre, const void* inp, const void* w,
                         const void* bias, int N, int IC, int OC, void* stream) {
  cudaStream_t s = as_stream(stream);
  // D = out, the epilogue's aux = out_pre (both OC x N column-major, ld OC); the bias as gemm's.
  const Gemm g{true, false, OC, N, IC, dtype, w, IC, inp, IC, dtype, out, OC, 0.0f, bias, nullptr, out_pre};
  if (gelu_epilogue_fits(kGeluEpilogueForward, g) && (!bias || is_aligned(bias, 16)) &&
      run_cublaslt(ctx, g, bias ? Epilogue::gelu_aux_bias : Epilogue::gelu_aux, s))
    return;
  matmul_forward(ctx, dtype, dtype, out_pre, inp, w, bias, N, IC, OC, stream);
  gelu_forward(dtype, out, out_pre, size_t(N) * OC, stream);
}

void matmul_backward_input_dgelu(MatmulContext* ctx, DType dtype, void* dpre, const void* dout, const void* w,
                                 const void* pre, int N, int IC, int OC, void* stream) {
  cudaStream_t s = as_stream(stream);
  // matmul_backward_input's product, with aux = pre laid out as D = dpre (IC x N, ld IC).
  const Gemm g{false, false, IC, N, OC, dtype, w, IC, dout, OC, dtype, dpre, IC, 0.0f, nullptr, nullptr, pre};
  if (gelu_epilogue_fits(kGeluEpilogueBackward, g) && run_cublaslt(ctx, g, Epilogue::dgelu, s)) return;
  matmul_backward_input(ctx, dtype, dtype, dpre, dout, w, N, IC, OC, stream);
  gelu_backward(dtype, dpre, pre, dpre, size_t(N) * IC, stream);  // in place: elementwise
}

size_t bias_backward_scratch_bytes(int N, int OC) { return ColumnSplit(N).scratch_bytes(OC, 1); }

void bias_backward(DType dtype, DType grad_dtype, void* dbias, const void* dout, int N, int OC, void* scratch,
                   void* stream) {
  if (N <= 0 || OC <= 0 || dbias == nullptr) return;
  check(scratch != nullptr, "bias_backward: scratch is null");
  cudaStream_t s = as_stream(stream);
  float* partial = static_cast<float*>(scratch);
  dispatch_act_grad("bias_backward", dtype, grad_dtype, [&](auto act, auto grad) {
    using T = decltype(act);
    using G = decltype(grad);
    const int chunks = launch_column_partials<T>(partial, static_cast<const T*>(dout), N, OC, s);
    launch_column_finalize<G>(nullptr, static_cast<G*>(dbias), nullptr, partial, chunks, OC, s);
  });
}

}  // namespace pt::gpu
