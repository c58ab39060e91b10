// Comm: collectives and point-to-point messages over ONE group of ranks (a Grid group: dp x cp,
// a ZeRO shard group, a tp group...). The trainer and the parallel layers call only this
// interface, so the same code runs over MPI on the CPU (MpiComm, host memory) and over NCCL on
// GPUs (NcclComm, device memory), and a group of one needs no library at all (LocalComm).
//
// Conventions, the same for every implementation:
//  - Every rank of the group makes the same calls in the same order with the same sizes
//    (collectives are matched by order, as in MPI and NCCL). A mismatch is a bug that hangs.
//  - Blocks are equal: reduce_scatter and all_gather move size() blocks of `n` elements each;
//    callers pad (ShardLayout pads every bucket to a multiple of the shard count).
//  - Reductions are sums. f32 tensors reduce in f32; host doubles (loss sums, token counts,
//    squared norms) reduce in f64. The order in which ranks' values are added may depend on
//    the algorithm the library picks for a message size: results are reproducible run to run
//    with the same layout, and agree with one rank to fp32 rounding (tests allow 1e-5 relative).
//  - Calls are blocking: when one returns, its output is complete (for device tensors: complete
//    for everything the backend runs after the call, in stream order). The exception is the
//    started reductions below, which let gradient buckets overlap backward.
//  - The header is an interface only (no key function in a .cpp), like Ops, so the CUDA library
//    can implement it without linking core.
#pragma once
#include <cstddef>
#include <vector>

#include "core/tensor/tensor.h"

namespace pt {

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;  // 0 .. size()-1, this process's index in the group
  virtual int size() const = 0;
  // The world ranks of the group's members, in group order (for logs and error messages).
  virtual const std::vector<int>& members() const = 0;

  // x = sum over the group of every rank's x, in place (f32).
  virtual void all_reduce(Tensor x) = 0;
  // The same for n host doubles (exact-enough sums of losses, token counts, squared norms).
  virtual void all_reduce(double* host, size_t n) = 0;

  // send holds size() blocks of recv.numel elements; block r of the result (the sum over the
  // group of every rank's block r) lands in recv on rank r. f32 only.
  virtual void reduce_scatter(Tensor send, Tensor recv) = 0;
  // recv (size() blocks of send.numel elements) gets every rank's send, in rank order. In place
  // when send is exactly this rank's block of recv. Any dtype (it only moves bytes).
  virtual void all_gather(Tensor send, Tensor recv) = 0;
  // Block r of send goes to rank r; block r of recv comes from rank r (equal blocks, any dtype).
  virtual void all_to_all(Tensor send, Tensor recv) = 0;
  // x on every rank = x on `root`.
  virtual void broadcast(Tensor x, int root) = 0;

  // Point-to-point (pipeline stages, ring attention): blocking, matched by order between the two
  // ranks. A send may wait until its receive is posted (NCCL's always does), so callers must
  // order them so that no rank sends to a peer that is itself sending first, in a cycle;
  // MpiComm's synchronous send makes the CPU tests prove that.
  virtual void send(Tensor x, int peer) = 0;
  virtual void recv(Tensor x, int peer) = 0;

  virtual void barrier() = 0;

  // Gradient buckets (GradSync): the same reductions, started without making the computation
  // that follows wait for them, so backward goes on while a bucket reduces. wait_started() makes
  // everything after it wait until every reduction this Comm started is complete. Between the
  // start and the wait the caller must not touch the tensors involved. A backend whose
  // collectives block the host (MPI, a group of one) just runs them here; NCCL runs them on its
  // own stream.
  virtual void start_all_reduce(Tensor x) { all_reduce(x); }
  virtual void start_reduce_scatter(Tensor send, Tensor recv) { reduce_scatter(send, recv); }
  virtual void wait_started() {}
};

}  // namespace pt
