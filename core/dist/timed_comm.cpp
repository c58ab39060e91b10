#include "core/dist/timed_comm.h"

#include <chrono>

#include "core/dist/comm_wait.h"

namespace pt {

const char* comm_kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::all_reduce: return "all_reduce";
    case CommKind::reduce_scatter: return "reduce_scatter";
    case CommKind::all_gather: return "all_gather";
    case CommKind::all_to_all: return "all_to_all";
    case CommKind::broadcast: return "broadcast";
    case CommKind::barrier: return "barrier";
    case CommKind::p2p: return "p2p";
    case CommKind::count: break;
  }
  return "?";
}

double CommStats::collective_seconds() const {
  double s = 0;
  for (int k = 0; k < kinds; k++)
    if (k != static_cast<int>(CommKind::p2p)) s += seconds[k];
  return s;
}

double CommStats::collective_bytes() const {
  double b = 0;
  for (int k = 0; k < kinds; k++)
    if (k != static_cast<int>(CommKind::p2p)) b += bytes[k];
  return b;
}

TimedComm::TimedComm(std::shared_ptr<Comm> inner, std::shared_ptr<CommStats> stats)
    : inner_(std::move(inner)), stats_(std::move(stats)) {}

template <class F>
void TimedComm::timed(CommKind kind, size_t bytes, F&& call, const char* what, int peer) {
  // A group of one moves nothing (its calls are copies at most): not communication.
  if (inner_->size() == 1) return call();
  const auto t0 = std::chrono::steady_clock::now();
  {
    // Whom this rank waits for, should the call never return (the watchdog's message).
    const CommWait wait(what ? what : comm_kind_name(kind), inner_->members(), inner_->rank(), peer);
    call();
  }
  const int k = static_cast<int>(kind);
  stats_->seconds[k] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_->bytes[k] += static_cast<double>(bytes);
  stats_->calls[k]++;
}

void TimedComm::all_reduce(Tensor x) {
  timed(CommKind::all_reduce, x.bytes(), [&] { inner_->all_reduce(x); });
}
void TimedComm::all_reduce(double* host, size_t n) {
  timed(CommKind::all_reduce, n * sizeof(double), [&] { inner_->all_reduce(host, n); });
}
void TimedComm::reduce_scatter(Tensor send, Tensor recv) {
  timed(CommKind::reduce_scatter, send.bytes(), [&] { inner_->reduce_scatter(send, recv); });
}
void TimedComm::start_all_reduce(Tensor x) {
  timed(CommKind::all_reduce, x.bytes(), [&] { inner_->start_all_reduce(x); });
}
void TimedComm::start_reduce_scatter(Tensor send, Tensor recv) {
  timed(CommKind::reduce_scatter, send.bytes(), [&] { inner_->start_reduce_scatter(send, recv); });
}
void TimedComm::all_gather(Tensor send, Tensor recv) {
  timed(CommKind::all_gather, recv.bytes(), [&] { inner_->all_gather(send, recv); });
}
void TimedComm::all_to_all(Tensor send, Tensor recv) {
  timed(CommKind::all_to_all, send.bytes(), [&] { inner_->all_to_all(send, recv); });
}
void TimedComm::broadcast(Tensor x, int root) {
  timed(CommKind::broadcast, x.bytes(), [&] { inner_->broadcast(x, root); });
}
void TimedComm::send(Tensor x, int peer) {
  timed(CommKind::p2p, x.bytes(), [&] { inner_->send(x, peer); }, "send to", peer);
}
void TimedComm::recv(Tensor x, int peer) {
  timed(CommKind::p2p, x.bytes(), [&] { inner_->recv(x, peer); }, "recv from", peer);
}
void TimedComm::barrier() {
  timed(CommKind::barrier, 0, [&] { inner_->barrier(); });
}

}  // namespace pt
