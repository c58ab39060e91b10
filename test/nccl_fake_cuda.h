// A stand-in for the CUDA runtime calls that NcclComm and CudaOps's set-up make, for tests that
// run NcclComm's real code on a machine without a GPU (test/nccl_comm_ranks.cpp, over the NCCL
// double of nccl_double.h). Linking nccl_fake_cuda.cpp into a test binary replaces those calls
// (an executable's own definitions win over libcudart.so's); any other CUDA call still reaches
// the real runtime and fails loudly without a GPU.
//
// "Device memory" is host memory from the fake cudaMalloc, and the fake knows every allocation,
// stream and event it made, so the NCCL double can refuse what a GPU would: a host pointer handed
// to NCCL, a buffer shorter than count x dtype, a stream that does not exist. Work runs at once
// on the calling thread, so streams and events are only checked, never ordered: the stream order
// of NcclComm is the one-GPU test's subject (test/gpu_nccl_comm.cpp), not this fake's.
#pragma once
#include <cstddef>

struct CUstream_st;

namespace pt::test::fake_cuda {

// The name the fake cudaGetDeviceProperties reports (tests check CudaOps sees it: the fake is linked).
constexpr const char* kDeviceName = "fake CUDA device (test/nccl_fake_cuda.cpp)";

// Whether [p, p + bytes) lies inside one live allocation of the fake cudaMalloc.
bool is_device(const void* p, size_t bytes);
// Whether `s` is a live stream of the fake (the legacy default stream, null, is not one:
// NcclComm runs NCCL on streams it made).
bool is_stream(CUstream_st* s);
// Allocations not yet freed: a test's leak check.
size_t live_allocations();

}  // namespace pt::test::fake_cuda
