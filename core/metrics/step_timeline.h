// StepTimeline: where a training step's time goes on the device. The trainer and the pipeline
// executor say which phase the work they issue next belongs to (enter); at each change of phase
// the timeline puts a time mark in the backend's op stream (Ops::record_time_mark: a CUDA event on
// the compute stream on the GPU, the host clock on the CPU). After the step, finish() waits for the
// device and gives each phase its milliseconds: the time from a mark to the next, summed.
//
// Because the marks sit in the op stream, on the GPU this is the GPU's own clock: a phase's time is
// when the device worked on it or sat idle waiting for it (a collective, the host launching the
// next kernels), not when the host happened to issue it. The phases tile the stream from the
// first mark to the last; what lies outside (reading the data before the first mark, the host's
// launch latency before it) is the step's wall time minus their sum.
//
// Cost: one event record per change of phase (about four per micro-batch) and one
// cudaEventElapsedTime per mark at the end of the step; no synchronisation besides finish()'s.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "core/ops/ops.h"

namespace pt {

enum class StepPhase {
  forward,    // forward passes and the loss (ZeRO-3's parameter gathers inside them included)
  backward,   // backward passes (recomputed forwards and in-backward gradient reductions included)
  pp_comm,    // pipeline parallel: sending and receiving activations and their gradients
  grad_sync,  // the gradient reductions not hidden behind backward, and the step's loss reduction
  optimizer,  // the gradient norm, clipping, AdamW, and ZeRO's gathering of the updated weights
};
constexpr int kStepPhases = 5;

// "forward", "backward", "pp_comm", "grad_sync", "optimizer": the metrics field is name + "_ms".
const char* step_phase_name(StepPhase p);

struct PhaseTimes {
  std::array<double, kStepPhases> ms{};
  double& operator[](StepPhase p) { return ms[static_cast<size_t>(p)]; }
  double operator[](StepPhase p) const { return ms[static_cast<size_t>(p)]; }
  double total_ms() const;
};

// "forward 35.1 ms (31%), backward ..., outside the device timeline 3.0 ms (3%: data 1.0 ms)" for a
// step of step_ms wall time, data_ms of it reading the data (phases at 0 ms are left out).
std::string describe_phases(const PhaseTimes& t, double step_ms, double data_ms);

class StepTimeline {
 public:
  explicit StepTimeline(Ops& ops) : ops_(ops) {}
  // Starts a step: forgets the previous one's marks and enters `first`.
  void start(StepPhase first);
  // The work issued from now on belongs to `p` (no mark when it already does). Ignored between
  // steps (before start or after finish), so code shared with evaluation can call it freely.
  void enter(StepPhase p);
  // Ends the step: a last mark, a synchronize(), and each phase's milliseconds.
  PhaseTimes finish();

 private:
  Ops& ops_;
  bool running_ = false;
  StepPhase current_ = StepPhase::forward;
  // The marks in order, each with the phase it opens (closed by the next mark).
  struct Mark {
    int id;
    StepPhase opens;
  };
  std::vector<Mark> marks_;
};

}  // namespace pt
