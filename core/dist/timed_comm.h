// TimedComm: a Comm that forwards every call to another and adds up, per kind of call, the wall
// time spent in it, the calls and the bytes they moved. The trainer wraps every process group in
// one (make_process_groups), all sharing one CommStats, so the run report can say how much of a
// step went to communication without the communication code knowing it is being timed.
//
// Times are wall times around blocking calls (comm.h: when a call returns its output is
// complete), so they include waiting for the slowest rank of the group: that is time this rank
// did not compute, which is what the report's breakdown wants. Bytes are the payload one rank
// hands to the call (all_gather: the gathered output; reduce_scatter: the full input), not the
// bytes a ring algorithm puts on the wire. Groups of one rank are not counted: they move nothing.
#pragma once
#include <array>
#include <cstdint>
#include <memory>

#include "core/dist/comm.h"

namespace pt {

// Pipeline point-to-point (send, recv) is a kind of its own: its time is the pipeline's wait
// (bubble and transfer), which the report shows separately from the collectives.
enum class CommKind : int { all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, barrier, p2p, count };
const char* comm_kind_name(CommKind kind);

struct CommStats {
  static constexpr int kinds = static_cast<int>(CommKind::count);
  std::array<double, kinds> seconds{};
  std::array<double, kinds> bytes{};
  std::array<uint64_t, kinds> calls{};
  // Every kind but p2p.
  double collective_seconds() const;
  double collective_bytes() const;
};

class TimedComm final : public Comm {
 public:
  // `inner` may serve several TimedComms (two groups of the same ranks share one communicator).
  TimedComm(std::shared_ptr<Comm> inner, std::shared_ptr<CommStats> stats);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::vector<int>& members() const override { return inner_->members(); }
  void all_reduce(Tensor x) override;
  void all_reduce(double* host, size_t n) override;
  void reduce_scatter(Tensor send, Tensor recv) override;
  void all_gather(Tensor send, Tensor recv) override;
  void all_to_all(Tensor send, Tensor recv) override;
  void broadcast(Tensor x, int root) override;
  void send(Tensor x, int peer) override;
  void recv(Tensor x, int peer) override;
  void barrier() override;
  // Started reductions count as their kind; their time is the host time of starting them.
  void start_all_reduce(Tensor x) override;
  void start_reduce_scatter(Tensor send, Tensor recv) override;
  void wait_started() override { inner_->wait_started(); }

 private:
  // `what`: the call's name in a hang message (nullptr: the kind's); `peer`: a send/recv's peer.
  template <class F>
  void timed(CommKind kind, size_t bytes, F&& call, const char* what = nullptr, int peer = -1);
  std::shared_ptr<Comm> inner_;
  std::shared_ptr<CommStats> stats_;
};

}  // namespace pt
