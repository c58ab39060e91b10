// Pipeline simulator: runs every rank's action list together, as the real ranks would, and
// checks the schedule. Used by the schedule tests and by `picotrain plan`.
//
// Semantics:
//   - computations take a fixed time (PipeCosts), communication takes none;
//   - messages carry no tag: each link delivers in order, so a receive that would get another
//     message than the one it names is an error (the rank would compute on the wrong data);
//   - PipeComm::blocking (the default, the worst case): a send completes only when the peer's
//     next action is the receive of that very message (rendezvous); both then go on at the
//     later of their two clocks. Every schedule must survive this without deadlock;
//   - PipeComm::async: sends and receives are posted without waiting (isend/irecv, as
//     Megatron runs its schedules) and a computation waits until its input has arrived.
// It reports:
//   - deadlock: no rank can move, with each stuck rank's next action;
//   - invalid: an action that breaks a rule (computes without its input, sends what it has not
//     computed, names the wrong peer, repeats or misses a micro-batch at some virtual stage);
//   - otherwise the makespan, each rank's busy and idle time, and its peak of micro-batches
//     in flight (forwarded on a chunk, not yet backwarded: the activations it holds).
#pragma once
#include <string>
#include <vector>

#include "core/train/pp_schedule.h"

namespace pt {

struct PipeCosts {
  double forward = 1.0;   // one chunk's forward of one micro-batch
  double backward = 2.0;  // its backward (about twice the forward's FLOPs)
  // Uneven stages (parallel.pp_layers; the embeddings and the head): rank r's computations take
  // rank_scale[r] times the costs above. Empty: every rank alike.
  std::vector<double> rank_scale;
};

// One computation as it ran.
struct PipeSlot {
  PipeAction action;
  double start = 0, end = 0;
};

struct PipeSimReport {
  enum class Status { ok, deadlock, invalid };
  Status status = Status::ok;
  std::string error;  // what went wrong; empty when ok
  double makespan = 0;
  std::vector<double> busy;                     // per rank: time computing
  // per rank: makespan - busy, the waits before its first and after its last computation
  // included (the step ends for every rank together, at the optimizer's collectives)
  std::vector<double> idle;
  std::vector<int> peak_in_flight;              // per rank, counted in (micro-batch, chunk) pairs
  std::vector<std::vector<PipeSlot>> timeline;  // per rank, its computations in order

  bool ok() const { return status == Status::ok; }
  // Idle time over compute time, summed over ranks: the definition of pipeline_bubble_ratio.
  double bubble_ratio() const;
  // Idle time over total time (pp * makespan): pipeline_bubble_fraction.
  double bubble_fraction() const;
};

enum class PipeComm { blocking, async };

// ranks[r] is rank r's action list; there are ranks.size() pipeline ranks.
PipeSimReport simulate_pipeline(const std::vector<std::vector<PipeAction>>& ranks, int virtual_stages,
                                int micro_batches, PipeCosts costs = {}, PipeComm comm = PipeComm::blocking);

// The timeline as text, one row per rank and chunk, one character per time unit (times are
// rounded to whole units): digits are forwards of that micro-batch, letters its backward
// (a = micro-batch 0), '.' is idle.
std::string format_pipeline_timeline(const PipeSimReport& report, int virtual_stages);

}  // namespace pt
