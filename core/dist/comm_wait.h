// CommWait: what this rank is blocked in, so that the hang watchdog can say whom it waits for.
//
// When a host drops off the network, or a rank freezes, the ranks that can still run wait in a
// collective or a pipeline receive, and all MPI says is nothing. The watchdog ends them
// (progress_watchdog.h); its message is only useful if it names who stopped answering. Each
// blocking call on a process group (TimedComm, which wraps every group) marks itself here for its
// duration: the call, the group's other members (or the one peer of a send/recv) and since when.
// The watchdog's thread reads the mark when it fires and names those ranks and their hosts:
// exactly the peer for pipeline and ring messages, the group for a collective (one of them, or a
// rank they in turn wait for, is the one that stopped; each rank's line names its own wait, so
// the lines together point at it).
//
// A heartbeat would name the dead rank in every case, but needs a second channel beside the
// collectives (a thread making MPI calls of its own: MPI_THREAD_MULTIPLE, nothing equivalent in
// NCCL) and costs traffic every step; this costs a lock per call and nothing on the wire.
#pragma once
#include <string>
#include <vector>

namespace pt {

// The host name of every world rank (gathered once at start-up by make_process_groups).
void set_rank_hosts(std::vector<std::string> hosts);
// "3 (host b)": a world rank and its host, as set_rank_hosts learned it (the number alone before).
std::string rank_and_host(int world_rank);

class CommWait {
 public:
  // `members`: the group's world ranks (must outlive this); `self`: this rank's index in it;
  // `peer`: the index of the one rank a send/recv waits for, or -1 for a collective.
  CommWait(const char* call, const std::vector<int>& members, int self, int peer = -1);
  ~CommWait();
  CommWait(const CommWait&) = delete;
  CommWait& operator=(const CommWait&) = delete;
};

// "this rank has waited 3.1 s in all_reduce with ranks 2 (host b), 3 (host b)", or "" when it is
// in no blocking call. Safe to call from another thread.
std::string describe_comm_wait();

}  // namespace pt
