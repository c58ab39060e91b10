// NcclComm (see nccl_comm.h): NCCL collectives on the communicator's stream, ordered against the
// CudaOps compute stream with two events.
#include "cuda/nccl_comm.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "cuda/cuda_common.h"
#include "cuda/cuda_ops.h"
#include "cuda/nccl_api.h"

namespace pt {

namespace {

void nccl_check(nccl::ncclResult_t rc, const char* what) {
  if (rc == nccl::ncclSuccess) return;
  throw RuntimeError(std::string("NCCL ") + what + " failed: " + nccl::api().GetErrorString(rc) +
                     " (NCCL_DEBUG=WARN prints NCCL's own explanation)");
}

nccl::ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return nccl::ncclFloat32;
    case DType::bf16: return nccl::ncclBfloat16;
    case DType::i32: return nccl::ncclInt32;
    case DType::f8e4m3:
    case DType::f8e5m2: return nccl::ncclUint8;  // moved as bits, never reduced
  }
  throw RuntimeError("NcclComm: unknown dtype");
}

void require_f32(Tensor t, const char* what) {
  check(t.dtype == DType::f32, std::string(what) + " reduces f32 tensors only (got " + dtype_name(t.dtype) + ")");
}

cudaStream_t compute_stream_of(Ops& ops) {
  auto* cuda = dynamic_cast<CudaOps*>(&ops);
  check(cuda != nullptr, std::string("NcclComm needs the CUDA backend's tensors, not the ") +
                             device_name(ops.device()) + " backend's");
  return static_cast<cudaStream_t>(cuda->stream());
}

// Every communicator alive in this process, for async_error(); guarded by live_mutex().
std::mutex& live_mutex() {
  static std::mutex m;
  return m;
}
std::vector<nccl::ncclComm_t>& live_comms() {
  static std::vector<nccl::ncclComm_t> comms;
  return comms;
}

// The completion event of the NCCL operation this process queued last, on any communicator (null:
// none yet). Every operation's stream waits for it first, so this rank's NCCL operations run one
// after another in the order the host queued them (nccl_comm.h, "Ordering"). Only the thread that
// drives training queues NCCL operations.
cudaEvent_t& last_queued() {
  static cudaEvent_t event = nullptr;
  return event;
}

}  // namespace

struct NcclComm::State {
  nccl::ncclComm_t comm = nullptr;
  cudaStream_t compute = nullptr;  // CudaOps's stream (not owned)
  cudaStream_t stream = nullptr;   // this communicator's stream
  cudaEvent_t inputs_ready = nullptr, outputs_ready = nullptr;
  double* scalars = nullptr;  // device staging for all_reduce of host doubles
  size_t scalars_capacity = 0;

  State(nccl::ncclComm_t c, cudaStream_t compute_stream) : comm(c), compute(compute_stream) {
    // Non-blocking: the communication stream does not wait on the legacy default stream; its
    // order with compute is exactly the two events.
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&outputs_ready, cudaEventDisableTiming));
    std::lock_guard<std::mutex> lock(live_mutex());
    live_comms().push_back(comm);
  }
  ~State() {
    {
      std::lock_guard<std::mutex> lock(live_mutex());
      auto& live = live_comms();
      live.erase(std::remove(live.begin(), live.end(), comm), live.end());
    }
    if (last_queued() == outputs_ready) last_queued() = nullptr;
    // No throwing here: a failed teardown (e.g. after a peer died) must not hide the first error.
    if (stream) cudaStreamSynchronize(stream);
    if (comm) nccl::api().CommDestroy(comm);
    if (scalars) cudaFree(scalars);
    if (inputs_ready) cudaEventDestroy(inputs_ready);
    if (outputs_ready) cudaEventDestroy(outputs_ready);
    if (stream) cudaStreamDestroy(stream);
  }
};

std::unique_ptr<NcclComm> NcclComm::make_world(Comm& host_world, Ops& ops) {
  const nccl::Api& api = nccl::api();  // throws the loader's message when NCCL is missing
  const cudaStream_t compute = compute_stream_of(ops);
  // Rank 0 makes the id; it travels as int32 words through the host world communicator.
  static_assert(nccl::kUniqueIdBytes % 4 == 0);
  std::vector<int32_t> words(nccl::kUniqueIdBytes / 4, 0);
  nccl::ncclUniqueId id{};
  if (host_world.rank() == 0) {
    nccl_check(api.GetUniqueId(&id), "ncclGetUniqueId");
    std::memcpy(words.data(), id.internal, nccl::kUniqueIdBytes);
  }
  host_world.broadcast(Tensor{words.data(), words.size(), DType::i32}, 0);
  std::memcpy(id.internal, words.data(), nccl::kUniqueIdBytes);
  nccl::ncclComm_t comm = nullptr;
  nccl_check(api.CommInitRank(&comm, host_world.size(), id, host_world.rank()), "ncclCommInitRank");
  auto state = std::make_unique<State>(comm, compute);
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(state), host_world.members(), host_world.rank()));
}

std::unique_ptr<NcclComm> NcclComm::split(const std::vector<int>& members) {
  const int me = members_[rank_];
  const auto at = std::find(members.begin(), members.end(), me);
  check(at != members.end(), "NcclComm::split: rank " + std::to_string(me) + " is not in its own group");
  for (int m : members)
    check(std::find(members_.begin(), members_.end(), m) != members_.end(),
          "NcclComm::split: rank " + std::to_string(m) + " is not in the communicator being split");
  const int color = *std::min_element(members.begin(), members.end());
  const int key = static_cast<int>(at - members.begin());
  nccl::ncclComm_t child = nullptr;
  // The parent's queued collectives must not overlap the split's own communication.
  CUDA_CHECK(cudaStreamSynchronize(state_->stream));
  nccl_check(nccl::api().CommSplit(state_->comm, color, key, &child, nullptr), "ncclCommSplit");
  auto state = std::make_unique<State>(child, state_->compute);
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(state), members, key));
}

void NcclComm::split_out() {
  nccl::ncclComm_t none = nullptr;
  CUDA_CHECK(cudaStreamSynchronize(state_->stream));
  nccl_check(nccl::api().CommSplit(state_->comm, nccl::kSplitNoColor, 0, &none, nullptr), "ncclCommSplit (no color)");
  check(none == nullptr, "ncclCommSplit with no color returned a communicator");
}

NcclComm::NcclComm(std::unique_ptr<State> state, std::vector<int> members, int rank)
    : state_(std::move(state)), members_(std::move(members)), rank_(rank) {}

NcclComm::~NcclComm() = default;

template <class F>
void NcclComm::ordered(const char* what, F&& launch, bool compute_waits) {
  State& s = *state_;
  CUDA_CHECK(cudaEventRecord(s.inputs_ready, s.compute));
  CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.inputs_ready, 0));
  // After the operation queued before it on another communicator (a wait takes the event as last
  // recorded, so re-recording it later changes nothing here).
  if (last_queued() && last_queued() != s.outputs_ready) CUDA_CHECK(cudaStreamWaitEvent(s.stream, last_queued(), 0));
  nccl_check(launch(s.stream), what);
  // outputs_ready always marks the latest call on this stream; the stream runs in order, so
  // waiting for it waits for every call before it too (what wait_started relies on).
  CUDA_CHECK(cudaEventRecord(s.outputs_ready, s.stream));
  last_queued() = s.outputs_ready;
  if (compute_waits) CUDA_CHECK(cudaStreamWaitEvent(s.compute, s.outputs_ready, 0));
}

void NcclComm::all_reduce(Tensor x) { all_reduce_f32(x, true); }
void NcclComm::start_all_reduce(Tensor x) { all_reduce_f32(x, false); }
void NcclComm::reduce_scatter(Tensor send, Tensor recv) { reduce_scatter_f32(send, recv, true); }
void NcclComm::start_reduce_scatter(Tensor send, Tensor recv) { reduce_scatter_f32(send, recv, false); }

void NcclComm::wait_started() {
  State& s = *state_;
  CUDA_CHECK(cudaStreamWaitEvent(s.compute, s.outputs_ready, 0));
}

void NcclComm::all_reduce_f32(Tensor x, bool compute_waits) {
  require_f32(x, "all_reduce");
  const nccl::Api& api = nccl::api();
  ordered(
      "ncclAllReduce",
      [&](cudaStream_t st) {
        return api.AllReduce(x.data, x.data, x.numel, nccl::ncclFloat32, nccl::ncclSum, state_->comm, st);
      },
      compute_waits);
}

void NcclComm::all_reduce(double* host, size_t n) {
  if (n == 0) return;
  State& s = *state_;
  if (s.scalars_capacity < n) {
    if (s.scalars) CUDA_CHECK(cudaFree(s.scalars));
    s.scalars = nullptr;
    CUDA_CHECK(cudaMalloc(&s.scalars, n * sizeof(double)));
    s.scalars_capacity = n;
  }
  const nccl::Api& api = nccl::api();
  const size_t bytes = n * sizeof(double);
  ordered("ncclAllReduce (f64)", [&](cudaStream_t st) {
    CUDA_CHECK(cudaMemcpyAsync(s.scalars, host, bytes, cudaMemcpyHostToDevice, st));
    const nccl::ncclResult_t rc = api.AllReduce(s.scalars, s.scalars, n, nccl::ncclFloat64, nccl::ncclSum, s.comm, st);
    if (rc == nccl::ncclSuccess) CUDA_CHECK(cudaMemcpyAsync(host, s.scalars, bytes, cudaMemcpyDeviceToHost, st));
    return rc;
  });
  CUDA_CHECK(cudaStreamSynchronize(s.stream));  // the sums are on the host when this returns
}

void NcclComm::reduce_scatter_f32(Tensor send, Tensor recv, bool compute_waits) {
  require_f32(send, "reduce_scatter");
  require_f32(recv, "reduce_scatter");
  check(send.numel == recv.numel * members_.size(),
        "reduce_scatter: send has " + std::to_string(send.numel) + " elements, expected " +
            std::to_string(members_.size()) + " blocks of " + std::to_string(recv.numel));
  const nccl::Api& api = nccl::api();
  ordered(
      "ncclReduceScatter",
      [&](cudaStream_t st) {
        return api.ReduceScatter(send.data, recv.data, recv.numel, nccl::ncclFloat32, nccl::ncclSum, state_->comm, st);
      },
      compute_waits);
}

void NcclComm::all_gather(Tensor send, Tensor recv) {
  check(send.dtype == recv.dtype && recv.numel == send.numel * members_.size(),
        "all_gather: recv has " + std::to_string(recv.numel) + " elements, expected " +
            std::to_string(members_.size()) + " blocks of " + std::to_string(send.numel));
  const nccl::Api& api = nccl::api();
  // In place (send is this rank's block of recv) is NCCL's own in-place case.
  ordered("ncclAllGather", [&](cudaStream_t st) {
    return api.AllGather(send.data, recv.data, send.numel, nccl_type(send.dtype), state_->comm, st);
  });
}

void NcclComm::all_to_all(Tensor send, Tensor recv) {
  check(send.dtype == recv.dtype && send.numel == recv.numel && send.numel % members_.size() == 0,
        "all_to_all: send and recv must be equal and hold " + std::to_string(members_.size()) +
            " equal blocks (send " + std::to_string(send.numel) + ", recv " + std::to_string(recv.numel) + ")");
  const size_t block = send.numel / members_.size();
  const nccl::Api& api = nccl::api();
  // ncclAlltoAll exists only in recent NCCL; one group of sends and receives is the classic form.
  ordered("all_to_all (ncclSend/ncclRecv group)", [&](cudaStream_t st) {
    nccl::ncclResult_t rc = api.GroupStart();
    for (int peer = 0; peer < size() && rc == nccl::ncclSuccess; peer++) {
      rc = api.Send(send.slice(peer * block, block).data, block, nccl_type(send.dtype), peer, state_->comm, st);
      if (rc == nccl::ncclSuccess)
        rc = api.Recv(recv.slice(peer * block, block).data, block, nccl_type(recv.dtype), peer, state_->comm, st);
    }
    const nccl::ncclResult_t end = api.GroupEnd();  // always closes the group, even after an error
    return rc != nccl::ncclSuccess ? rc : end;
  });
}

void NcclComm::broadcast(Tensor x, int root) {
  const nccl::Api& api = nccl::api();
  ordered("ncclBroadcast", [&](cudaStream_t st) {
    return api.Broadcast(x.data, x.data, x.numel, nccl_type(x.dtype), root, state_->comm, st);
  });
}

void NcclComm::send(Tensor x, int peer) {
  const nccl::Api& api = nccl::api();
  ordered("ncclSend", [&](cudaStream_t st) {
    return api.Send(x.data, x.numel, nccl_type(x.dtype), peer, state_->comm, st);
  });
}

void NcclComm::recv(Tensor x, int peer) {
  const nccl::Api& api = nccl::api();
  ordered("ncclRecv", [&](cudaStream_t st) {
    return api.Recv(x.data, x.numel, nccl_type(x.dtype), peer, state_->comm, st);
  });
}

std::string NcclComm::async_error() {
  std::lock_guard<std::mutex> lock(live_mutex());
  if (live_comms().empty()) return "";
  const nccl::Api& api = nccl::api();  // loaded: a communicator exists
  for (nccl::ncclComm_t comm : live_comms()) {
    nccl::ncclResult_t state = nccl::ncclSuccess;
    if (api.CommGetAsyncError(comm, &state) != nccl::ncclSuccess) continue;
    if (state != nccl::ncclSuccess && state != nccl::ncclInProgress)
      return std::string("NCCL reported an asynchronous error: ") + api.GetErrorString(state) +
             " (a peer or the network failed; NCCL_DEBUG=WARN prints NCCL's own explanation)";
  }
  return "";
}

void NcclComm::barrier() {
  // A sum every rank must join, waited for on the host.
  double token = 0;
  all_reduce(&token, 1);
}

}  // namespace pt
