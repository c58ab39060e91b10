// Timing cuBLASLt's candidates for one product (precision.matmul_algos = "timed").
//
// Computes nothing of the model's: each candidate runs the product on the real inputs into
// scratch outputs, once to warm up and kRuns times between two events; the fastest mean wins.
// Cost: (1 + kRuns) x up to 8 candidates x the product's own time, once per distinct product of a
// run (GPT-2 124M at B 64: about 20 products of 0.3-5 ms, about a second in all), plus scratch of
// the product's output size (a product is left untimed when the device lacks the room).
#include "cuda/matmul_algo_timing.h"

#include <cstdio>
#include <cstring>

#include "cuda/cuda_common.h"
#include "cuda/matmul_cublaslt.h"

namespace pt::gpu {

namespace {

constexpr int kCandidates = 8;
constexpr int kRuns = 3;
constexpr size_t kHeadroomBytes = size_t(512) << 20;  // left free for the run's own allocations

bool same_algo(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Scratch outputs and two events, released on every path. The scratch is stream-ordered
// (cudaMallocAsync): a cudaFree would wait for the whole device, NCCL's streams included.
struct TimingScratch {
  cudaStream_t stream = nullptr;
  void* bytes = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~TimingScratch() {
    if (bytes) cudaFreeAsync(bytes, stream);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

}  // namespace

TimedChoice time_candidates(MatmulContext* ctx, Descriptors& desc, const TimedProduct& p,
                            const cublasLtMatmulAlgo_t& first, cudaStream_t stream) {
  TimedChoice out;
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(ctx->handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref, kCandidates,
                                     results, &found) != CUBLAS_STATUS_SUCCESS)
    found = 0;
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t d_room = (p.d_bytes + 255) / 256 * 256, need = d_room + (p.aux_out ? p.aux_bytes : 0);
  if (need + kHeadroomBytes > free_bytes) return out;

  TimingScratch s;
  s.stream = stream;
  CUDA_CHECK(cudaMallocAsync(&s.bytes, need, stream));
  CUDA_CHECK(cudaMemsetAsync(s.bytes, 0, need, stream));  // defined inputs for beta = 1
  CUDA_CHECK(cudaEventCreate(&s.start));
  CUDA_CHECK(cudaEventCreate(&s.stop));
  void* d = s.bytes;
  void* aux = static_cast<char*>(s.bytes) + d_room;
  if (p.aux_out)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));

  const float alpha = 1.0f, beta = p.beta;
  // The mean time of one call of `algo` in microseconds; negative when the library refuses it.
  auto time_one = [&](const cublasLtMatmulAlgo_t& algo) -> double {
    auto run = [&] {
      return cublasLtMatmul(ctx->handle, desc.op, &alpha, p.A, desc.a, p.B, desc.b, &beta, d, desc.d, d, desc.d,
                            &algo, p.workspace, kWorkspaceBytes, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) return -1.0;  // warm-up, and the library's own check
    CUDA_CHECK(cudaEventRecord(s.start, stream));
    for (int r = 0; r < kRuns; r++)
      if (run() != CUBLAS_STATUS_SUCCESS) return -1.0;
    CUDA_CHECK(cudaEventRecord(s.stop, stream));
    CUDA_CHECK(cudaEventSynchronize(s.stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, s.start, s.stop));
    return 1e3 * ms / kRuns;
  };

  const double first_us = time_one(first);
  if (first_us >= 0) out = {true, first, first_us};
  for (int i = 0; i < found; i++) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || same_algo(results[i].algo, first)) continue;
    const double us = time_one(results[i].algo);
    if (us >= 0 && (!out.ok || us < out.fastest_us)) out = {true, results[i].algo, us};
  }
  if (p.aux_out)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux_out,
                                                sizeof p.aux_out));
  CUDA_CHECK(cudaGetLastError());
  out.first_us = first_us;
  return out;
}

std::string matmul_library_name() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  char name[512];
  std::snprintf(name, sizeof name, "cuBLASLt %zu, %s, sm_%d%d, %d SMs", cublasLtGetVersion(), prop.name, prop.major,
                prop.minor, prop.multiProcessorCount);
  return name;
}

std::string algo_hex(const cublasLtMatmulAlgo_t& algo) {
  static const char digits[] = "0123456789abcdef";
  const auto* bytes = reinterpret_cast<const unsigned char*>(&algo);
  std::string hex;
  for (size_t i = 0; i < sizeof algo; i++) {
    hex += digits[bytes[i] >> 4];
    hex += digits[bytes[i] & 15];
  }
  return hex;
}

bool algo_from_hex(const std::string& hex, cublasLtMatmulAlgo_t* algo) {
  if (hex.size() != 2 * sizeof *algo) return false;
  auto* bytes = reinterpret_cast<unsigned char*>(algo);
  for (size_t i = 0; i < sizeof *algo; i++) {
    int v = 0;
    for (int h = 0; h < 2; h++) {
      const char c = hex[2 * i + h];
      const int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (x < 0) return false;
      v = v * 16 + x;
    }
    bytes[i] = static_cast<unsigned char>(v);
  }
  return true;
}

}  // namespace pt::gpu
