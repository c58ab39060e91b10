// Timing cuBLASLt's candidate algorithms for one product (precision.matmul_algos = "timed";
// core/ops/matmul_algos.h says why the choice is made once per run and agreed by every rank).
// For cuda/*.cu only (includes cublasLt.h through matmul_context.h).
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "core/ops/matmul_algos.h"
#include "cuda/matmul_context.h"

namespace pt::gpu {

// What a product writes, which timing must not touch: D (d_bytes from D's pointer) and, for the
// GELU_AUX epilogues, the aux matrix (aux_bytes; aux_out nullptr: none written). Timing writes
// both into scratch instead. Whatever else the epilogue writes (BGRADB's fp32 vector) is scratch
// of the caller's that the real call overwrites afterwards.
struct TimedProduct {
  const void* A;
  const void* B;
  float beta;
  size_t d_bytes;
  void* aux_out;
  size_t aux_bytes;
  void* workspace;  // the product's lane's (kWorkspaceBytes)
};

struct TimedChoice {
  bool ok = false;               // false: nothing timed (no candidates, or no memory for scratch)
  cublasLtMatmulAlgo_t fastest{};
  double fastest_us = 0;         // one call, the mean of a few
  double first_us = -1;          // the heuristic's first choice, timed alike (< 0: it failed)
};

// Times up to 8 of the heuristic's candidates for the product in `desc` (its preference, set by
// the caller, bounds the workspace and the reduction scheme) on `stream`, and returns the fastest.
// Synchronises the stream (this happens once per product, in a run's first step). `first` is the
// heuristic's first choice, timed like the others (first_us, for the log).
TimedChoice time_candidates(MatmulContext* ctx, Descriptors& desc, const TimedProduct& p,
                            const cublasLtMatmulAlgo_t& first, cudaStream_t stream);

// "cuBLASLt <version>, <GPU name>, sm_<cc>, <SMs> SMs" of the current device: where a choice
// holds (MatmulContext::library, worked out once).
std::string matmul_library_name();

// cublasLtMatmulAlgo_t as hex and back (false: not an algorithm's bytes).
std::string algo_hex(const cublasLtMatmulAlgo_t& algo);
bool algo_from_hex(const std::string& hex, cublasLtMatmulAlgo_t* algo);

}  // namespace pt::gpu
