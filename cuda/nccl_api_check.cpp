// Compile-time check of nccl_api.h against a real nccl.h. CMake defines PICOTRAIN_NCCL_HEADER_CHECK
// (and adds the header's folder) only for this file and only when it finds nccl.h (NCCL_ROOT,
// PICOTRAIN_NCCL_INCLUDE, e.g. pip's site-packages/nvidia/nccl/include); without it the file is
// empty. A mismatch in an enum value, a size or a signature fails the build here instead of
// corrupting a collective at run time.
#ifdef PICOTRAIN_NCCL_HEADER_CHECK
#include <nccl.h>

#include <type_traits>

#include "cuda/nccl_api.h"

namespace pt::nccl {
namespace {

// Our type -> the header's type, so a function pointer type of ours can be compared with the
// header's function's type.
template <class T>
struct Header {
  using type = T;
};
template <>
struct Header<ncclResult_t> {
  using type = ::ncclResult_t;
};
template <>
struct Header<ncclResult_t*> {  // ncclCommGetAsyncError's out-parameter
  using type = ::ncclResult_t*;
};
template <>
struct Header<ncclDataType_t> {
  using type = ::ncclDataType_t;
};
template <>
struct Header<ncclRedOp_t> {
  using type = ::ncclRedOp_t;
};
template <>
struct Header<ncclComm_t> {
  using type = ::ncclComm_t;
};
template <>
struct Header<ncclComm_t*> {
  using type = ::ncclComm_t*;
};
template <>
struct Header<ncclUniqueId> {
  using type = ::ncclUniqueId;
};
template <>
struct Header<ncclUniqueId*> {
  using type = ::ncclUniqueId*;
};
template <>
struct Header<void*> {  // only ncclCommSplit's config argument is declared void*
  using type = void*;
};
template <class R, class... A>
struct Header<R (*)(A...)> {
  using type = typename Header<R>::type (*)(typename Header<A>::type...);
};

template <class Ours, class Theirs>
constexpr bool same_signature = std::is_same_v<typename Header<Ours>::type, Theirs>;

static_assert(sizeof(ncclUniqueId) == sizeof(::ncclUniqueId) && kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(sizeof(ncclResult_t) == sizeof(::ncclResult_t));
static_assert(sizeof(ncclDataType_t) == sizeof(::ncclDataType_t));
static_assert(sizeof(ncclRedOp_t) == sizeof(::ncclRedOp_t));
static_assert(ncclSuccess == int(::ncclSuccess) && ncclUnhandledCudaError == int(::ncclUnhandledCudaError) &&
              ncclSystemError == int(::ncclSystemError) && ncclInternalError == int(::ncclInternalError) &&
              ncclInvalidArgument == int(::ncclInvalidArgument) && ncclInvalidUsage == int(::ncclInvalidUsage) &&
              ncclRemoteError == int(::ncclRemoteError) && ncclInProgress == int(::ncclInProgress));
static_assert(ncclUint8 == int(::ncclUint8) && ncclInt32 == int(::ncclInt32) && ncclFloat32 == int(::ncclFloat32) &&
              ncclFloat64 == int(::ncclFloat64) && ncclBfloat16 == int(::ncclBfloat16));
static_assert(ncclSum == int(::ncclSum));

static_assert(same_signature<decltype(Api::GetErrorString), decltype(&::ncclGetErrorString)>);
static_assert(same_signature<decltype(Api::GetVersion), decltype(&::ncclGetVersion)>);
static_assert(same_signature<decltype(Api::GetUniqueId), decltype(&::ncclGetUniqueId)>);
static_assert(same_signature<decltype(Api::CommInitRank), decltype(&::ncclCommInitRank)>);
// ncclCommSplit's config is an ncclConfig_t*: compare with that argument as void*.
static_assert(std::is_same_v<decltype(&::ncclCommSplit),
                             ::ncclResult_t (*)(::ncclComm_t, int, int, ::ncclComm_t*, ::ncclConfig_t*)>);
static_assert(same_signature<decltype(Api::CommDestroy), decltype(&::ncclCommDestroy)>);
static_assert(same_signature<decltype(Api::CommAbort), decltype(&::ncclCommAbort)>);
static_assert(same_signature<decltype(Api::CommGetAsyncError), decltype(&::ncclCommGetAsyncError)>);
static_assert(same_signature<decltype(Api::AllReduce), decltype(&::ncclAllReduce)>);
static_assert(same_signature<decltype(Api::ReduceScatter), decltype(&::ncclReduceScatter)>);
static_assert(same_signature<decltype(Api::AllGather), decltype(&::ncclAllGather)>);
static_assert(same_signature<decltype(Api::Broadcast), decltype(&::ncclBroadcast)>);
static_assert(same_signature<decltype(Api::Send), decltype(&::ncclSend)>);
static_assert(same_signature<decltype(Api::Recv), decltype(&::ncclRecv)>);
static_assert(same_signature<decltype(Api::GroupStart), decltype(&::ncclGroupStart)>);
static_assert(same_signature<decltype(Api::GroupEnd), decltype(&::ncclGroupEnd)>);

}  // namespace
}  // namespace pt::nccl
#endif  // PICOTRAIN_NCCL_HEADER_CHECK
