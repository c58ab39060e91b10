#ifdef PICOTRAIN_WITH_MPI
#include "core/dist/mpi_comm.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <initializer_list>

namespace pt {

struct MpiComm::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
};

namespace {

// Every MPI call on our communicators returns its error (MPI_ERRORS_RETURN) and becomes an
// exception naming the operation, instead of MPI's default of killing the job without a word.
void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw RuntimeError(std::string("MPI ") + what + " failed: " + std::string(text, len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT32_T;
    case DType::bf16: return MPI_UINT16_T;  // moved as bits, never reduced
    case DType::f8e4m3:
    case DType::f8e5m2: return MPI_BYTE;  // the same
  }
  return MPI_BYTE;
}

void require_f32(Tensor t, const char* what) {
  check(t.dtype == DType::f32, std::string(what) + " reduces f32 tensors only (got " + dtype_name(t.dtype) + ")");
}

// MPI counts are ints: a block must fit (2^31 - 1 elements, 8 GiB of floats).
int block_count(size_t n, const char* what) {
  check(n <= static_cast<size_t>(INT_MAX), std::string(what) + ": a block of " + std::to_string(n) +
                                               " elements exceeds MPI's int count");
  return static_cast<int>(n);
}

// Whole-buffer operations are split into int-sized pieces so any tensor size works.
constexpr size_t kPiece = size_t(1) << 30;

// The host memory one MPI call works on. Host tensors are used where they are; device tensors
// (with a HostStaging) get a region of the shared pinned buffer: the call's inputs are copied
// down before it (fetch) and its outputs back up after it (store).
class HostViews {
 public:
  HostViews(HostStaging* staging, std::initializer_list<Tensor> tensors) : staging_(staging), tensors_(tensors) {
    constexpr size_t kAlign = 256;  // each region starts aligned, as a device buffer would
    size_t total = 0;
    for (const Tensor& t : tensors_) {
      const bool staged = staging_ && t.data && staging_->on_device(t.data);
      offsets_.push_back(staged ? total : kHost);
      if (staged) total += (t.bytes() + kAlign - 1) / kAlign * kAlign;
    }
    char* base = total > 0 ? static_cast<char*>(staging_->host_buffer(total)) : nullptr;
    for (size_t i = 0; i < tensors_.size(); i++)
      hosts_.push_back(offsets_[i] == kHost ? static_cast<char*>(tensors_[i].data) : base + offsets_[i]);
  }
  bool staged(size_t i) const { return offsets_[i] != kHost; }
  char* host(size_t i) const { return hosts_[i]; }
  void fetch(size_t i) {
    if (staged(i)) staging_->to_host(hosts_[i], tensors_[i].data, tensors_[i].bytes());
  }
  void store(size_t i) {
    if (staged(i)) staging_->to_device(tensors_[i].data, hosts_[i], tensors_[i].bytes());
  }

 private:
  static constexpr size_t kHost = ~size_t(0);
  HostStaging* staging_;
  std::vector<Tensor> tensors_;
  std::vector<size_t> offsets_;
  std::vector<char*> hosts_;
};

}  // namespace

std::unique_ptr<MpiComm> MpiComm::split_world(const std::vector<int>& members, std::shared_ptr<HostStaging> staging) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const auto me = std::find(members.begin(), members.end(), world_rank);
  check(me != members.end(), "MpiComm::split_world: rank " + std::to_string(world_rank) + " is not in its own group");
  const int color = *std::min_element(members.begin(), members.end());
  const int key = static_cast<int>(me - members.begin());
  auto h = std::make_unique<Handle>();
  mpi_check(MPI_Comm_split(MPI_COMM_WORLD, color, key, &h->comm), "Comm_split");
  MPI_Comm_set_errhandler(h->comm, MPI_ERRORS_RETURN);
  int size = 0, rank = 0;
  MPI_Comm_size(h->comm, &size);
  MPI_Comm_rank(h->comm, &rank);
  // Every member must have named the same group; a different size means they did not.
  check(size == static_cast<int>(members.size()) && rank == key,
        "MpiComm::split_world: rank " + std::to_string(world_rank) + " expected a group of " +
            std::to_string(members.size()) + " ranks but MPI formed one of " + std::to_string(size));
  return std::unique_ptr<MpiComm>(new MpiComm(std::move(h), members, rank, std::move(staging)));
}

MpiComm::MpiComm(std::unique_ptr<Handle> handle, std::vector<int> members, int rank,
                 std::shared_ptr<HostStaging> staging)
    : handle_(std::move(handle)), staging_(std::move(staging)), members_(std::move(members)), rank_(rank) {}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && handle_->comm != MPI_COMM_NULL) MPI_Comm_free(&handle_->comm);
}

void MpiComm::all_reduce(Tensor x) {
  require_f32(x, "all_reduce");
  HostViews v(staging_.get(), {x});
  v.fetch(0);
  float* data = reinterpret_cast<float*>(v.host(0));
  for (size_t off = 0; off < x.numel; off += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, x.numel - off));
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, data + off, n, MPI_FLOAT, MPI_SUM, handle_->comm), "Allreduce");
  }
  v.store(0);
}

void MpiComm::all_reduce(double* host, size_t n) {
  for (size_t off = 0; off < n; off += kPiece) {
    const int k = static_cast<int>(std::min(kPiece, n - off));
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, host + off, k, MPI_DOUBLE, MPI_SUM, handle_->comm), "Allreduce");
  }
}

void MpiComm::reduce_scatter(Tensor send, Tensor recv) {
  require_f32(send, "reduce_scatter");
  require_f32(recv, "reduce_scatter");
  check(send.numel == recv.numel * members_.size(),
        "reduce_scatter: send has " + std::to_string(send.numel) + " elements, expected " +
            std::to_string(members_.size()) + " blocks of " + std::to_string(recv.numel));
  const int n = block_count(recv.numel, "reduce_scatter");
  HostViews v(staging_.get(), {send, recv});
  v.fetch(0);
  mpi_check(MPI_Reduce_scatter_block(v.host(0), v.host(1), n, MPI_FLOAT, MPI_SUM, handle_->comm),
            "Reduce_scatter_block");
  v.store(1);
}

void MpiComm::all_gather(Tensor send, Tensor recv) {
  check(send.dtype == recv.dtype && recv.numel == send.numel * members_.size(),
        "all_gather: recv has " + std::to_string(recv.numel) + " elements, expected " +
            std::to_string(members_.size()) + " blocks of " + std::to_string(send.numel));
  const int n = block_count(send.numel, "all_gather");
  HostViews v(staging_.get(), {send, recv});
  v.fetch(0);
  // In place only when MPI sees the caller's own buffers; staged copies never overlap.
  const bool in_place = !v.staged(0) && !v.staged(1) && send.data == static_cast<char*>(recv.data) + rank_ * send.bytes();
  mpi_check(MPI_Allgather(in_place ? MPI_IN_PLACE : v.host(0), n, mpi_type(send.dtype), v.host(1), n,
                          mpi_type(recv.dtype), handle_->comm),
            "Allgather");
  v.store(1);
}

void MpiComm::all_to_all(Tensor send, Tensor recv) {
  check(send.dtype == recv.dtype && send.numel == recv.numel && send.numel % members_.size() == 0,
        "all_to_all: send and recv must be equal and hold " + std::to_string(members_.size()) +
            " equal blocks (send " + std::to_string(send.numel) + ", recv " + std::to_string(recv.numel) + ")");
  const int n = block_count(send.numel / members_.size(), "all_to_all");
  HostViews v(staging_.get(), {send, recv});
  v.fetch(0);
  mpi_check(MPI_Alltoall(v.host(0), n, mpi_type(send.dtype), v.host(1), n, mpi_type(recv.dtype), handle_->comm),
            "Alltoall");
  v.store(1);
}

void MpiComm::broadcast(Tensor x, int root) {
  HostViews v(staging_.get(), {x});
  if (rank_ == root) v.fetch(0);
  const size_t elem = dtype_size(x.dtype);
  for (size_t off = 0; off < x.numel; off += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, x.numel - off));
    mpi_check(MPI_Bcast(v.host(0) + off * elem, n, mpi_type(x.dtype), root, handle_->comm), "Bcast");
  }
  if (rank_ != root) v.store(0);
}

void MpiComm::send(Tensor x, int peer) {
  // Synchronous (MPI_Ssend: returns only once the receive has started), like NCCL's send, which
  // buffers nothing: a schedule that only works because MPI buffered a small message would
  // deadlock on GPUs, and with Ssend it deadlocks in the CPU tests instead.
  HostViews v(staging_.get(), {x});
  v.fetch(0);
  const size_t elem = dtype_size(x.dtype);
  for (size_t off = 0; off < x.numel; off += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, x.numel - off));
    mpi_check(MPI_Ssend(v.host(0) + off * elem, n, mpi_type(x.dtype), peer, 0, handle_->comm), "Ssend");
  }
}

void MpiComm::recv(Tensor x, int peer) {
  HostViews v(staging_.get(), {x});
  const size_t elem = dtype_size(x.dtype);
  for (size_t off = 0; off < x.numel; off += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, x.numel - off));
    mpi_check(MPI_Recv(v.host(0) + off * elem, n, mpi_type(x.dtype), peer, 0, handle_->comm, MPI_STATUS_IGNORE),
              "Recv");
  }
  v.store(0);
}

void MpiComm::barrier() { mpi_check(MPI_Barrier(handle_->comm), "Barrier"); }

}  // namespace pt
#endif  // PICOTRAIN_WITH_MPI
