// The part of NCCL's C API picotrain uses, declared here and loaded at run time (dlopen), so the
// binary builds without NCCL's headers and starts without the library: only a run that chooses
// the NCCL backend needs libnccl.so.2 (parallel.comm_backend, core/dist/comm_backend.h).
//
// The declarations follow NCCL's public header, src/nccl.h.in in github.com/NVIDIA/nccl (NCCL
// 2.18 and later; the enum values have been stable since 2.x): ncclResult_t, ncclDataType_t and
// ncclRedOp_t values, NCCL_UNIQUE_ID_BYTES = 128, and the signatures of the functions below.
// When CMake finds a real nccl.h (NCCL_ROOT or PICOTRAIN_NCCL_INCLUDE), nccl_api_check.cpp
// compiles static_asserts that our values, sizes and signatures equal the header's.
//
// The names live in pt::nccl so they can never clash with a real nccl.h in the same program.
#pragma once
#include <cstddef>
#include <string>

struct CUstream_st;  // cudaStream_t is CUstream_st* (cuda_runtime_api.h); no CUDA header needed

namespace pt::nccl {

using cudaStream_t = CUstream_st*;

struct ncclComm;  // declared on its own line: a struct of pt::nccl even where nccl.h is included
typedef ncclComm* ncclComm_t;
constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
typedef struct {
  char internal[kUniqueIdBytes];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

typedef enum { ncclSum = 0 } ncclRedOp_t;

// ncclCommSplit's color for a rank that joins no new communicator (it gets none back).
constexpr int kSplitNoColor = -1;

// The entry points, resolved with dlsym. ncclCommSplit's last argument is an ncclConfig_t*;
// we always pass nullptr (inherit the parent's configuration), so it is declared as void*.
struct Api {
  std::string path;  // the library that was loaded
  int version = 0;   // ncclGetVersion: major*10000 + minor*100 + patch (2.9 and later)
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t*, void*) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
};

// The environment variable that names the library file (default: libnccl.so.2 on the loader's
// search path).
constexpr const char* kLibraryEnv = "PICOTRAIN_NCCL_LIB";

// Loads NCCL once per process (later calls return the first result). nullptr when it cannot be
// loaded; then load_error() says why in one line: the file, the loader's message, the env
// variable and what to install.
const Api* try_load();
const std::string& load_error();
// The loaded API; throws RuntimeError with load_error() when NCCL is not there.
const Api& api();

// Test-only: from now on try_load() and api() return `table` (nullptr: load the library as
// before). test/nccl_double.cpp installs its in-process NCCL of several ranks this way, so the
// real NcclComm runs over it without NCCL or a GPU; nothing else calls this. Call it while no
// NCCL call is in flight.
void install_for_testing(const Api* table);

// "2.21.5" from ncclGetVersion's code.
std::string version_string(int code);

}  // namespace pt::nccl
