// The inside of gpu::MatmulContext (matmul_cublaslt.h), shared by the sources that run cuBLASLt
// products on it: cuda/matmul_cublaslt.cu (bf16/fp32) and cuda/matmul_fp8.cu (FP8). One handle,
// a workspace per lane and one cache of the heuristic's choices per CudaOps; and Descriptors, the RAII
// holder of one call's cuBLASLt descriptors, which both build. Includes cublasLt.h: for cuda/*.cu
// only, never for g++-compiled code outside cuda/.
#pragma once
#include <cublasLt.h>

#include <map>
#include <string>

#include "core/common/error.h"
#include "core/ops/matmul_algos.h"

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
  void* side_workspace = nullptr;  // lane 1's (matmul_cublaslt.h): a product beside lane 0's
  std::string library;             // matmul_library_name() of the device it was made on
  struct Choice {
    bool ok = false;  // false: the heuristic offered nothing for this problem
    cublasLtMatmulAlgo_t algo{};
  };
  // problem key -> the algorithm it runs (the heuristic's first, or one given by use_matmul_algos).
  // Each source's keys start differently ("fp8 ..." for matmul_fp8.cu), so one map serves both.
  std::map<std::string, Choice> algos;
  bool warned_fallback = false;
  // precision.matmul_algos (core/ops/matmul_algos.h; bf16/fp32 products, not FP8's):
  bool timing = false;  // products seen for the first time have their candidates timed...
  MatmulAlgos timed;    // ...into here
  // Algorithms given by use_matmul_algos, taken up (checked against the library) when their
  // product is first seen.
  std::map<std::string, cublasLtMatmulAlgo_t> given;
  bool warned_given = false;
};

// RAII for the cuBLASLt descriptors of one product (both sources build them per call): the
// operation, the layouts of A, B and D, and the heuristic's preference; whichever were created
// are destroyed when it goes out of scope, on the error paths too (CUBLAS_CHECK throws).
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace pt::gpu
