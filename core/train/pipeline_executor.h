// PipelineExecutor: runs one pipeline rank's part of a training step, its action list from
// pipeline_schedule(kind, pp, v, m, rank) (pp_schedule.h), over the model chunks it owns
// (pipeline_stages.h), with blocking point-to-point messages to its pipeline neighbours.
// With pp = 1 the list is forward/backward of micro-batch 0, 1, ... and nothing is sent: the
// one-rank trainer runs through the same code.
//
// Per action:
//   recv_activation  into the input buffer of a fresh I/O slot of that chunk;
//   forward          into a fresh activation set (embedding chunk: and a fresh I/O slot, from
//                    the micro-batch's tokens); head chunk: the loss (summed here) and the
//                    head's backward;
//   send_activation  the chunk's output buffer, which is free again when send returns (MpiComm's
//                    synchronous send returns once the receive has started, NcclComm's send is
//                    stream-ordered before the next op; the schedule's ordering rule puts the
//                    send before this rank's next computation, which is checked);
//   recv_grad        into the slot's gradient buffer;
//   backward         accumulates into the parameter gradients (ZeRO hooks per layer), then frees
//                    the activation set;
//   send_grad        the I/O slot's gradient of its input, after which the I/O slot is free.
// A chunk needs as many activation sets as it ever has micro-batches between their forward and
// backward (1f1b: pp - rank, afab: m), and as many I/O slots as between the receive and the
// send of the gradient (pipeline_slots): the next input may arrive before a backward.
//
// Gradient accumulation and reduction. Micro-batches = batch.grad_accum_steps; their gradients
// add up in the ParamStore (GradSync, ZeRO 0-3, within this stage's dp x cp group). GradSync is
// told the last micro-step begins where only computations of the last micro-batch remain in
// the list, so under ZeRO 0-1 buckets whose layers that tail completes are reduced there and
// the rest in finish_step (the trainer's; on the CPU backend MPI is blocking, nothing overlaps).
// Tied embeddings with pp > 1: the first stage's wte (embedding) and the last stage's copy (LM
// head) each accumulate their own gradient over the whole step; the embeddings' grads_ready is
// held back until the schedule is done, then the two gradients are summed over the 2-rank
// embedding group (before any dp reduction, so both stages reduce the same values) and handed to
// GradSync. Collectives inside computations (ZeRO) involve the same stage of every dp replica,
// which runs the identical list, so they cannot deadlock with the pipeline's messages.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config/run_config.h"
#include "core/dist/comm.h"
#include "core/metrics/step_timeline.h"
#include "core/model/decoder_stage.h"
#include "core/model/layer_hooks.h"
#include "core/model/param_store.h"
#include "core/model/pipeline_stages.h"
#include "core/ops/ops.h"
#include "core/train/grad_sync.h"
#include "core/train/pp_schedule.h"

namespace pt {

// What one rank did in one step (its time, by phase, is in the caller's StepTimeline).
struct PipelineStepStats {
  double loss_sum = 0;  // head: the summed per-token losses of every micro-batch (else 0)
  double tokens = 0;    // head: the tokens with a target (else 0)
};

// The measured bubble of one rank's step: the time in pipeline send/recv (waiting on neighbours)
// over the time of the schedule (forward + backward + send/recv), on the device's clock.
double pipeline_bubble_of(const PhaseTimes& t);

// The slots each of this rank's chunks needs for `actions` (its pipeline_schedule list): the most
// micro-batches a chunk holds at once in each kind of slot (decoder_stage.h), at least one.
std::vector<StageSlots> pipeline_slots(const std::vector<PipeAction>& actions, int virtual_stages);

// The executor's own device memory for one rank's `chunks`: the step's ids where a chunk has the
// embedding (inputs) or the head (targets), m x micro_tokens i32 each, and the head's m loss sums.
size_t pipeline_step_buffer_bytes(const std::vector<StageLayers>& chunks, int micro_batches, size_t micro_tokens);

class PipelineExecutor {
 public:
  // Builds (allocates) this rank's chunks of the model on `store`: the schedule, micro-batches
  // and shapes come from `cfg` (parallel.*, batch.*, recompute.mode); the chunks run over the
  // tensor- and context-parallel groups `mp` (the micro-batches are then this rank's
  // B x seq_len/cp tokens). Talks to no other rank.
  PipelineExecutor(const RunConfig& cfg, int pp_rank, ParamStore& store, Ops& ops, const ModelParallel& mp = {});
  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  // pp_group: the ranks of this pipeline in stage order (group rank = pp coordinate);
  // embedding_group: the first and the last stage (their wte copies) when pp > 1; any
  // (ignored) on the other ranks or when pp == 1. Not owned. Needed before the first step.
  void connect(Comm& pp_group, Comm* embedding_group);
  // The runtime's layer hooks and gradient reduction (not owned; nullptr: none).
  void set_grad_runtime(LayerHooks* hooks, std::vector<GradSync*> syncs);

  // One step's schedule. inputs and targets: the step's micro-batches, m * B * T host ids each
  // (T = seq_len / cp: this rank's tokens; read only by the embedding and head chunks; may be
  // null on other ranks). dloss: the loss
  // gradient per token. The gradients are complete (up to GradSync::finish_step) on return.
  // timeline (optional, started by the caller): told the phase of each action.
  PipelineStepStats train_step(const int32_t* inputs, const int32_t* targets, float dloss,
                               StepTimeline* timeline = nullptr);
  // Evaluation of one micro-batch through the pipeline (each chunk in turn, no schedule):
  // the summed per-token losses on the head's rank, 0 elsewhere. `fingerprints` (optional):
  // receives each of this rank's chunks' forward_fingerprint, in chunk order.
  double forward_only(const int32_t* inputs, const int32_t* targets, std::vector<uint64_t>* fingerprints = nullptr);
  // After forward_only, on the head's rank: each token's loss (B x T/cp, 0 where the target is < 0).
  std::vector<float> head_token_losses();

  // CUDA graphs (run.cuda_graphs). While on, each forward and backward of the schedule is
  // recorded (Ops::record) the first time it runs and replayed in later steps with one launch
  // (but for the last micro-batch's computations when gradient reductions over other ranks
  // start inside them: set_grad_runtime's GradSyncs say so; those run op by op);
  // the pipeline's sends and receives, the tied embedding's sum and the time marks stay outside,
  // between the replays. The micro-batches' ids come from device buffers the step fills first, and
  // the losses go to device sums read after the schedule, so a recording reads nothing from the
  // host that changes. A step whose loss gradient differs from the recorded one runs op by op.
  // A recording the backend refuses turns graphs off (graph_fallback() says why) and the work
  // runs op by op, in the same step.
  void use_graphs(bool on);
  bool graphs_on() const { return graphs_on_; }
  int graphs_recorded() const;
  long long graph_replays() const { return graph_replays_; }
  // Why graphs went off during a step ("" while they have not); cleared by take.
  std::string take_graph_fallback() { return std::exchange(graph_fallback_, std::string()); }

  // The corruption check (run.replay_every_steps). While on, train_step keeps the
  // forward_fingerprint of each chunk's forward of micro-batch 0 (recorded_fingerprints(), in
  // chunk order); forward_only of the same micro-batch with the same weights must give the same.
  void record_fingerprints(bool on) { record_ = on; }
  const std::vector<uint64_t>& recorded_fingerprints() const { return fingerprints_; }

  bool has_embedding() const;  // this rank reads inputs
  bool has_head() const;       // this rank reads targets and computes the loss
  const std::vector<StageLayers>& chunks() const { return chunk_layers_; }
  const std::vector<PipeAction>& actions() const { return actions_; }
  const std::vector<StageSlots>& slots() const { return slots_; }
  // The chunks' activation memory and the executor's step buffers (pipeline_step_buffer_bytes).
  size_t activation_bytes() const;
  DecoderStage& chunk(int c) { return *chunks_[static_cast<size_t>(c)]; }

 private:
  class TiedEmbeddingHooks;
  // Runs schedule entry `action` (a forward or backward of `ch` in the slots `at`): `work` as it
  // is, or its recording (use_graphs).
  void run_compute(size_t action, DecoderStage& ch, MicroSlot at, float dloss, const std::function<void()>& work);
  PipeSchedule kind_;
  int pp_, v_, m_, rank_, B_, T_;
  ParamStore& store_;
  Ops& ops_;
  Comm* pp_group_ = nullptr;
  Comm* embedding_group_ = nullptr;
  std::vector<GradSync*> syncs_;  // the dense store's, and under expert parallel the experts'
  std::vector<StageLayers> chunk_layers_;
  std::vector<PipeAction> actions_;
  std::vector<StageSlots> slots_;
  size_t last_micro_start_ = 0;  // index in actions_ where only the last micro-batch remains
  std::vector<std::unique_ptr<DecoderStage>> chunks_;
  std::unique_ptr<TiedEmbeddingHooks> tied_hooks_;
  bool record_ = false;
  std::vector<uint64_t> fingerprints_;  // per chunk, of micro-batch 0's forward
  // The step's micro-batches' ids (embedding: inputs; head: targets, m x B x T i32) and the
  // head's loss sum of each micro-batch (f32 [m]), on the device.
  Tensor step_tokens_, step_targets_, loss_sums_;
  // use_graphs: per schedule entry, its recording (null until recorded; never for messages).
  std::vector<std::unique_ptr<RecordedWork>> graphs_;
  std::vector<bool> reports_embeddings_;  // per entry: its host code reports the tied embeddings' gradient
  size_t recordable_end_ = 0;  // schedule entries from here on are never recorded (set_grad_runtime)
  bool graphs_on_ = false;
  std::optional<float> graph_dloss_;  // the loss gradient the recordings hold
  long long graph_replays_ = 0;
  std::string graph_fallback_;
};

// The checksum of the bits of a chunk's last_hidden() after a forward (read back from the
// device): every block's output and the final norm's feed into it, so a flipped bit in any of
// them changes it.
uint64_t forward_fingerprint(Ops& ops, const DecoderStage& chunk);

}  // namespace pt
