// Pipeline schedules: a pure function from (schedule, pp, virtual stages v, micro-batches m,
// rank) to the list of actions that rank runs for one optimizer step.
//
// Stages. The layers are cut into S = pp*v consecutive pieces, the virtual stages 0..S-1.
// Rank r holds the v model chunks c = 0..v-1; chunk c is virtual stage c*pp + r. With v = 1 the
// chunk is always 0 and the virtual stage is the rank. Activations flow stage s -> s+1 (rank
// r -> r+1; with v > 1 the last rank hands chunk c to rank 0's chunk c+1, so the ranks form a
// ring), gradients flow back s+1 -> s. Stage 0's forward reads the data (no recv); the last
// stage's forward ends in the loss, whose gradient starts its own backward (no send).
//
// Diagrams: pp=4, m=8, one row per rank (per rank and chunk with v=2), one character per time
// unit with forward = backward = 1 unit: digits are forwards of that micro-batch, letters its
// backward (a = micro-batch 0), '.' is idle. Made by format_pipeline_timeline (pp_simulator.h).
//
// afab (GPipe): every forward, then every backward. Rank r holds all m micro-batches'
// activations when the backwards start. Bubble: pp-1 forward+backward slots per rank.
//
//   rank 0  01234567......abcdefgh
//   rank 1  .01234567....abcdefgh.
//   rank 2  ..01234567..abcdefgh..
//   rank 3  ...01234567abcdefgh...
//
// 1f1b: rank r runs min(pp-r-1, m) warm-up forwards, then alternates one forward with one
// backward (oldest micro-batch first), then drains the remaining backwards. The same bubble
// and step time as afab, but rank r holds at most pp-r micro-batches' activations, not m.
//
//   rank 0  0123...a4b5c6d7e.f.g.h
//   rank 1  .012..a3b4c5d6e7f.g.h.
//   rank 2  ..01.a2b3c4d5e6f7g.h..
//   rank 3  ...0a1b2c3d4e5f6g7h...
//
// interleaved (Megatron's interleaved 1F1B), here v=2: each rank runs v chunks; micro-batches
// go through the chunks in groups of pp (chunk 0 of micro-batches 0..pp-1, chunk 1 of the same,
// ..., then the next group), which is why m must be a multiple of pp. Rank r warms up with
// (pp-r-1)*2 + (v-1)*pp forwards (all v*m when m == pp), then 1F1B, then cool-down. A chunk is
// 1/v of a stage, so the fill and drain cost pp-1 chunk slots instead of pp-1 stage slots: the
// bubble shrinks by v, paid for with v times more point-to-point messages (and with the last
// rank sending chunk c's output to rank 0's chunk c+1, the ranks form a ring).
//
//   rank 0 chunk 0  0123....456.7........a.bcd........efgh
//   rank 0 chunk 1  ....0123...a.b..4c5d6.7....e.f.g.h....
//   rank 1 chunk 0  .0123....4.5.6.7..a.b.c.d........efgh.
//   rank 1 chunk 1  .....0123.a.b.c.d4.5.6.7..e.f.g.h.....
//   rank 2 chunk 0  ..0123......4.5.6a7b.c.d........efgh..
//   rank 2 chunk 1  ......012a3b.c.d....4.5.6e7f.g.h......
//   rank 3 chunk 0  ...0123........4a5b6c7d........efgh...
//   rank 3 chunk 1  .......0a1b2c3d........4e5f6g7h.......
//
// Here a time unit is one chunk's computation, half a stage's: 38 units are 19 stage units
// against afab's and 1f1b's 22, of which 16 are compute either way. Formulas: pp_bubble.h.
//
// Communication and the ordering rule. The lists must run with plain blocking sends and receives
// that carry no tag, even when a send returns only once the peer has posted the matching
// receive (rendezvous, the worst case). Every message (the activation or the gradient of one
// micro-batch leaving one virtual stage) gets one global key: the time its producer finishes in
// the schedule's dependency-only timeline with unit-time computations, ties broken by (kind,
// producing stage, micro-batch). Both ends compute the same key. Every rank issues its sends
// and receives in increasing key order, merged with its computations by time: a send right
// after the computation that produces it, a receive before the one that consumes it.
//  - No deadlock: a rank blocked on message X waits for a peer that has not reached X, so the
//    peer is blocked on a message with a smaller key; a cycle of waiting ranks would need keys
//    that decrease all the way round, which is impossible.
//  - Right data: both ends of a link list its messages in the same (key) order, so in-order,
//    tagless matching hands each payload to the receive that names it.
//  - No stall when forward and backward take equal time (all ranks then share one integer
//    clock, so the receiver is always between computations when a message is produced), and
//    none for afab and 1f1b with backward/forward = 1.5, 2, 3 either (tested). Interleaved
//    with backward != forward loses part of its gain under strictly blocking sends; posted as
//    isend/irecv (each computation waiting for its input, as Megatron does) every kind meets
//    its bubble formula at those costs.
// No combined send+receive action is needed. The simulator (pp_simulator.h) checks all this.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace pt {

enum class PipeSchedule { afab, one_f_one_b, interleaved };

// "afab" | "1f1b" | "interleaved" (the values of parallel.pp_schedule); ConfigError otherwise.
PipeSchedule parse_pipe_schedule(std::string_view name);
std::string_view to_string(PipeSchedule kind);

enum class PipeOp { forward, backward, send_activation, recv_activation, send_grad, recv_grad };

// One step of a rank's list. chunk is this rank's model chunk the action belongs to:
//   forward / backward:  the chunk that computes;
//   send_activation:     the chunk whose output is sent (to the next virtual stage);
//   recv_activation:     the chunk whose input arrives (from the previous virtual stage);
//   send_grad:           the chunk whose input gradient is sent (to the previous stage);
//   recv_grad:           the chunk whose output gradient arrives (from the next stage).
// peer is the other end's rank in the pp group for the four communication ops, -1 otherwise.
struct PipeAction {
  PipeOp op = PipeOp::forward;
  int micro_batch = 0;
  int chunk = 0;
  int peer = -1;
  bool operator==(const PipeAction&) const = default;
};

// "send_activation(micro 3, chunk 0) -> rank 2": for error messages and debugging.
std::string to_string(const PipeAction& a);

// Throws ConfigError unless (kind, pp, v, m) is a schedule picotrain can run; the message
// names the config keys (parallel.pp, parallel.pp_virtual_stages, batch.grad_accum_steps).
void check_pipeline_schedule(PipeSchedule kind, int pp, int virtual_stages, int micro_batches);

// The forward and backward computations alone, in the order rank `rank` runs them.
std::vector<PipeAction> pipeline_compute_order(PipeSchedule kind, int pp, int virtual_stages, int micro_batches,
                                               int rank);

// The full action list of one rank, communication included (see the ordering rule above).
std::vector<PipeAction> pipeline_schedule(PipeSchedule kind, int pp, int virtual_stages, int micro_batches,
                                          int rank);

// Every rank's list at once (index = rank): what the simulator and `picotrain plan` take.
std::vector<std::vector<PipeAction>> pipeline_schedule_all_ranks(PipeSchedule kind, int pp, int virtual_stages,
                                                                 int micro_batches);

// pipeline_schedule_all_ranks built once per (kind, pp, virtual_stages, micro_batches) and kept
// for the life of the process (thread-safe): the planner asks for the same few schedules for
// many layouts, and building one is its costliest part.
const std::vector<std::vector<PipeAction>>& shared_pipeline_schedule(PipeSchedule kind, int pp, int virtual_stages,
                                                                     int micro_batches);

}  // namespace pt
