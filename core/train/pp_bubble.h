// The pipeline bubble: the time ranks sit idle because the pipeline fills and drains.
//
// Two ways to state the same idle time; picotrain uses the first as its headline number:
//   bubble ratio     = idle time / compute time, per rank:  (pp-1)/m       for afab and 1f1b,
//                                                            (pp-1)/(v*m)   for interleaved;
//   bubble fraction  = idle time / total time:               ratio / (1 + ratio),
//                      e.g. (pp-1)/(m+pp-1) for afab and 1f1b.
// Why: with F and B the forward and backward time of one micro-batch on one stage, the step
// takes (m + pp - 1)(F + B) on every rank (the first micro-batch needs pp-1 stages to reach
// the last rank, the last gradient pp-1 to come back), of which m(F + B) is compute. The
// 1f1b reordering changes memory, not this time. Interleaving cuts a stage into v chunks of
// time F/v and B/v: the fill and drain still cross pp-1 ranks, but now in chunk-sized steps.
// The simulator (pp_simulator.h) measures the same two quantities and the tests check that
// they agree exactly for B/F = 1, 1.5, 2 and 3: afab and 1f1b with blocking or asynchronous
// sends; interleaved with asynchronous point-to-point (isend/irecv posted in list order, each
// computation waiting for its input, as Megatron runs it), but with strictly blocking sends
// only for B = F. With blocking sends and B = 2F a sender often stalls until a receiver that
// is mid-backward reaches its receive, and interleaving loses most of its gain (pp=4, v=2,
// m=8: 37.5% measured against 18.75% by the formula, no better than 1f1b's 37.5%).
#pragma once
#include <optional>
#include <string>

#include "core/train/pp_schedule.h"

namespace pt {

// Idle over compute time (see above). 0 when pp == 1.
double pipeline_bubble_ratio(PipeSchedule kind, int pp, int virtual_stages, int micro_batches);

// Idle over total time: ratio / (1 + ratio).
double pipeline_bubble_fraction(PipeSchedule kind, int pp, int virtual_stages, int micro_batches);

// The warning to log when the bubble ratio exceeds `threshold` (25% by default), e.g.
//   pipeline bubble 37.5% ((pp-1)/m with pp=4, m=8; pp = parallel.pp, m = batch.grad_accum_steps
//   micro-batches) is above 25% of compute time: raise batch.global_batch_tokens or lower
//   batch.micro_batch_size to get more micro-batches, or use parallel.pp_schedule="interleaved"
// nullopt when the bubble is small enough (always when pp == 1).
std::optional<std::string> pipeline_bubble_warning(PipeSchedule kind, int pp, int virtual_stages,
                                                   int micro_batches, double threshold = 0.25);

}  // namespace pt
