#ifdef PICOTRAIN_WITH_MPI
#include "core/dist/mpi_comm.h"

#include <mpi.h>

#include <algorithm>
#include <climits>

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

}  // namespace

std::unique_ptr<MpiComm> MpiComm::split_world(const std::vector<int>& members) {
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
  return std::unique_ptr<MpiComm>(new MpiComm(std::move(h), members, rank));
}

MpiComm::MpiComm(std::unique_ptr<Handle> handle, std::vector<int> members, int rank)
    : handle_(std::move(handle)), members_(std::move(members)), rank_(rank) {}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && handle_->comm != MPI_COMM_NULL) MPI_Comm_free(&handle_->comm);
}

void MpiComm::all_reduce(Tensor x) {
  require_f32(x, "all_reduce");
  for (size_t off = 0; off < x.numel; off += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, x.numel - off));
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, x.f32() + off, n, MPI_FLOAT, MPI_SUM, handle_->comm), "Allreduce");
  }
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
  mpi_check(MPI_Reduce_scatter_block(send.data, recv.data, n, MPI_FLOAT, MPI_SUM, handle_->comm),
            "Reduce_scatter_block");
}

void MpiComm::all_gather(Tensor send, Tensor recv) {
  check(send.dtype == recv.dtype && recv.numel == send.numel * members_.size(),
        "all_gather: recv has " + std::to_string(recv.numel) + " elements, expected " +
            std::to_string(members_.size()) + " blocks of " + std::to_string(send.numel));
  const int n = block_count(send.numel, "all_gather");
  const bool in_place = send.data == static_cast<char*>(recv.data) + rank_ * send.bytes();
  mpi_check(MPI_Allgather(in_place ? MPI_IN_PLACE : send.data, n, mpi_type(send.dtype), recv.data, n,
                          mpi_type(recv.dtype), handle_->comm),
            "Allgather");
}

void MpiComm::all_to_all(Tensor send, Tensor recv) {
  check(send.dtype == recv.dtype && send.numel == recv.numel && send.numel % members_.size() == 0,
        "all_to_all: send and recv must be equal and hold " + std::to_string(members_.size()) +
            " equal blocks (send " + std::to_string(send.numel) + ", recv " + std::to_string(recv.numel) + ")");
  const int n = block_count(send.numel / members_.size(), "all_to_all");
  mpi_check(MPI_Alltoall(send.data, n, mpi_type(send.dtype), recv.data, n, mpi_type(recv.dtype), handle_->comm),
            "Alltoall");
}

void MpiComm::broadcast(Tensor x, int root) {
  const size_t elem = dtype_size(x.dtype);
  for (size_t off = 0; off < x.numel; off += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, x.numel - off));
    mpi_check(MPI_Bcast(static_cast<char*>(x.data) + off * elem, n, mpi_type(x.dtype), root, handle_->comm), "Bcast");
  }
}

void MpiComm::send(Tensor x, int peer) {
  const size_t elem = dtype_size(x.dtype);
  for (size_t off = 0; off < x.numel; off += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, x.numel - off));
    mpi_check(MPI_Send(static_cast<char*>(x.data) + off * elem, n, mpi_type(x.dtype), peer, 0, handle_->comm), "Send");
  }
}

void MpiComm::recv(Tensor x, int peer) {
  const size_t elem = dtype_size(x.dtype);
  for (size_t off = 0; off < x.numel; off += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, x.numel - off));
    mpi_check(MPI_Recv(static_cast<char*>(x.data) + off * elem, n, mpi_type(x.dtype), peer, 0, handle_->comm,
                       MPI_STATUS_IGNORE),
              "Recv");
  }
}

void MpiComm::barrier() { mpi_check(MPI_Barrier(handle_->comm), "Barrier"); }

}  // namespace pt
#endif  // PICOTRAIN_WITH_MPI
