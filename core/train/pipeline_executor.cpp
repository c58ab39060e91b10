#include "core/train/pipeline_executor.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "core/ckpt/checksum.h"

namespace pt {

namespace {

bool is_compute(const PipeAction& a) { return a.op == PipeOp::forward || a.op == PipeOp::backward; }

// Which slot of its chunk each micro-batch in flight holds, for one kind of slot: a micro-batch
// takes the lowest free one when it starts and gives it back when it ends.
class SlotPool {
 public:
  SlotPool(int v, int m) : m_(m), slot_(static_cast<size_t>(v) * m, -1), busy_(v), peak_(v, 0) {}

  int start(int chunk, int micro) {
    int& s = at(chunk, micro);
    check(s == -1, "internal error: micro-batch " + std::to_string(micro) + " of chunk " + std::to_string(chunk) +
                       " takes a slot twice in one step");
    std::vector<bool>& busy = busy_[static_cast<size_t>(chunk)];
    s = static_cast<int>(std::find(busy.begin(), busy.end(), false) - busy.begin());
    if (s == static_cast<int>(busy.size())) busy.push_back(false);
    busy[static_cast<size_t>(s)] = true;
    int& peak = peak_[static_cast<size_t>(chunk)];
    peak = std::max(peak, static_cast<int>(std::count(busy.begin(), busy.end(), true)));
    return s;
  }
  // The slot of a started micro-batch (starting it when `start_if_new`).
  int of(int chunk, int micro, bool start_if_new = false) {
    const int s = at(chunk, micro);
    if (s >= 0) return s;
    check(start_if_new && s == -1, "internal error: micro-batch " + std::to_string(micro) + " of chunk " +
                                       std::to_string(chunk) + " has no slot");
    return start(chunk, micro);
  }
  void finish(int chunk, int micro) {
    int& s = at(chunk, micro);
    check(s >= 0, "internal error: micro-batch " + std::to_string(micro) + " of chunk " + std::to_string(chunk) +
                      " frees a slot it does not hold");
    busy_[static_cast<size_t>(chunk)][static_cast<size_t>(s)] = false;
    s = -2;  // done for this step
  }
  int peak(int chunk) const { return peak_[static_cast<size_t>(chunk)]; }

 private:
  int& at(int chunk, int micro) { return slot_[static_cast<size_t>(chunk) * m_ + micro]; }
  int m_;
  std::vector<int> slot_;
  std::vector<std::vector<bool>> busy_;
  std::vector<int> peak_;
};

// The two kinds of slots (decoder_stage.h) through one step's action list. An I/O slot lives from
// the receive of the input (or the forward, without one) to the send of the input's gradient
// (or the backward, without one); an activation set from the forward to the backward.
class SlotTable {
 public:
  SlotTable(const std::vector<PipeAction>& actions, int v) : io_(v, micro_count(actions)), acts_(v, micro_count(actions)) {
    for (const auto& a : actions)
      if (a.op == PipeOp::send_grad) sends_grad_.insert({a.chunk, a.micro_batch});
  }
  int received(int chunk, int micro) { return io_.start(chunk, micro); }
  MicroSlot forward(int chunk, int micro) { return {io_.of(chunk, micro, true), acts_.start(chunk, micro)}; }
  int io(int chunk, int micro) { return io_.of(chunk, micro); }
  MicroSlot backward(int chunk, int micro) { return {io_.of(chunk, micro), acts_.of(chunk, micro)}; }
  void backward_done(int chunk, int micro) {
    acts_.finish(chunk, micro);
    if (!sends_grad_.count({chunk, micro})) io_.finish(chunk, micro);
  }
  void grad_sent(int chunk, int micro) { io_.finish(chunk, micro); }
  StageSlots peak(int chunk) const { return {std::max(1, io_.peak(chunk)), std::max(1, acts_.peak(chunk))}; }

 private:
  static int micro_count(const std::vector<PipeAction>& actions) {
    int m = 0;
    for (const auto& a : actions) m = std::max(m, a.micro_batch + 1);
    return m;
  }
  SlotPool io_, acts_;
  std::set<std::pair<int, int>> sends_grad_;
};

}  // namespace

std::vector<StageSlots> pipeline_slots(const std::vector<PipeAction>& actions, int virtual_stages) {
  SlotTable t(actions, virtual_stages);
  for (const auto& a : actions) {
    switch (a.op) {
      case PipeOp::recv_activation: t.received(a.chunk, a.micro_batch); break;
      case PipeOp::forward: t.forward(a.chunk, a.micro_batch); break;
      case PipeOp::backward: t.backward_done(a.chunk, a.micro_batch); break;
      case PipeOp::send_grad: t.grad_sent(a.chunk, a.micro_batch); break;
      default: break;
    }
  }
  std::vector<StageSlots> out;  // at least one of each: evaluation needs them without training
  for (int c = 0; c < virtual_stages; c++) out.push_back(t.peak(c));
  return out;
}

// The hooks the chunks call: the runtime's, except that with a tied embedding split over two
// stages the embeddings' grads_ready waits until both copies' gradients are summed.
class PipelineExecutor::TiedEmbeddingHooks final : public LayerHooks {
 public:
  LayerHooks* inner = nullptr;
  bool hold_embeddings = false;
  bool embeddings_held = false;
  void acquire_params(int layer) override {
    if (inner) inner->acquire_params(layer);
  }
  void release_params(int layer) override {
    if (inner) inner->release_params(layer);
  }
  void acquire_grads(int layer) override {
    if (inner) inner->acquire_grads(layer);
  }
  void grads_ready(int layer) override {
    if (hold_embeddings && layer < 0) {
      embeddings_held = true;
      return;
    }
    if (inner) inner->grads_ready(layer);
  }
};

PipelineExecutor::PipelineExecutor(const RunConfig& cfg, int pp_rank, ParamStore& store, Ops& ops,
                                   const ModelParallel& mp)
    : kind_(parse_pipe_schedule(cfg.parallel.pp_schedule)),
      pp_(cfg.parallel.pp),
      v_(cfg.parallel.pp_virtual_stages),
      m_(cfg.batch.grad_accum_steps),
      rank_(pp_rank),
      B_(cfg.batch.micro_batch_size),
      T_(cfg.batch.seq_len / mp.cp_size()),
      store_(store),
      ops_(ops),
      tied_hooks_(std::make_unique<TiedEmbeddingHooks>()) {
  chunk_layers_ = pipeline_chunks(cfg.model, cfg.parallel, pp_rank);
  actions_ = pipeline_schedule(kind_, pp_, v_, m_, pp_rank);
  slots_ = pipeline_slots(actions_, v_);
  const Recompute recompute = parse_recompute(cfg.recompute.mode);
  const Fp8Recipe fp8 = fp8_recipe(cfg.precision);
  for (int c = 0; c < v_; c++)
    chunks_.push_back(std::make_unique<DecoderStage>(cfg.model, store, ops, B_, cfg.batch.seq_len,
                                                  chunk_layers_[static_cast<size_t>(c)], slots_[static_cast<size_t>(c)],
                                                  recompute, mp, fp8));
  // Where GradSync's last micro-step begins: from here on only the last micro-batch computes.
  last_micro_start_ = actions_.size();
  for (size_t i = actions_.size(); i-- > 0;) {
    if (!is_compute(actions_[i])) continue;
    if (actions_[i].micro_batch != m_ - 1) break;
    last_micro_start_ = i;
  }
  recordable_end_ = actions_.size();
  // A tied head: the first and the last stage each hold the token embedding (an untied head is
  // the last stage's own, like the final norm).
  tied_hooks_->hold_embeddings = pp_ > 1 && cfg.model.tied() && (has_embedding() || has_head());
  for (auto& ch : chunks_) ch->set_hooks(tied_hooks_.get());
  fingerprints_.assign(chunks_.size(), 0);
  // The step's micro-batches on the device, uploaded once a step; the head's loss sums, read once.
  const size_t step_ids = static_cast<size_t>(m_) * B_ * T_;
  if (has_embedding()) step_tokens_ = ops_.alloc(step_ids, DType::i32);
  if (has_head()) {
    step_targets_ = ops_.alloc(step_ids, DType::i32);
    loss_sums_ = ops_.alloc(static_cast<size_t>(m_), DType::f32);
  }
  graphs_.resize(actions_.size());
  reports_embeddings_.assign(actions_.size(), false);
}

PipelineExecutor::~PipelineExecutor() {
  graphs_.clear();  // before the buffers they read
  for (Tensor* t : {&step_tokens_, &step_targets_, &loss_sums_})
    if (*t) ops_.release(*t);
}

void PipelineExecutor::use_graphs(bool on) {
  if (!on) {
    graphs_.clear();
    graphs_.resize(actions_.size());
    graph_dloss_.reset();
  }
  graphs_on_ = on;
}

int PipelineExecutor::graphs_recorded() const {
  return static_cast<int>(std::count_if(graphs_.begin(), graphs_.end(), [](const auto& g) { return g != nullptr; }));
}

void PipelineExecutor::run_compute(size_t action, DecoderStage& ch, MicroSlot at, float dloss,
                                   const std::function<void()>& work) {
  const bool forward = actions_[action].op == PipeOp::forward;
  // Replays bake the loss gradient in: a step with another (the NaN-gradient fault) runs op by op.
  if (!graphs_on_ || action >= recordable_end_ || !std::isfinite(dloss) || (graph_dloss_ && *graph_dloss_ != dloss))
    return work();
  std::unique_ptr<RecordedWork>& g = graphs_[action];
  if (!g) {
    const DecoderStage::HostMarks before = ch.host_marks();
    // Whether the work's host code reports the tied embeddings' gradient (TiedEmbeddingHooks),
    // seen from a clear flag; each replay reports it again.
    const bool held = std::exchange(tied_hooks_->embeddings_held, false);
    std::string why;
    g = ops_.record(work, &why);
    reports_embeddings_[action] = tied_hooks_->embeddings_held;
    tied_hooks_->embeddings_held = held;
    ch.restore(before);  // the recording ran the host code once; the replay's marks follow below
    if (!g) {
      graph_fallback_ = "the " + std::string(forward ? "forward" : "backward") + " of micro-batch " +
                        std::to_string(actions_[action].micro_batch) + " could not be recorded: " + why;
      use_graphs(false);
      return work();
    }
    graph_dloss_ = dloss;
  }
  g->replay();
  ch.after_replay(forward, at, dloss);
  if (reports_embeddings_[action]) tied_hooks_->embeddings_held = true;
  graph_replays_++;
}

void PipelineExecutor::connect(Comm& pp_group, Comm* embedding_group) {
  check(pp_group.size() == pp_ && pp_group.rank() == rank_,
        "PipelineExecutor: the pipeline group has " + std::to_string(pp_group.size()) + " ranks (this one " +
            std::to_string(pp_group.rank()) + "), the layout pp=" + std::to_string(pp_) + " (this rank " +
            std::to_string(rank_) + ")");
  check(!tied_hooks_->hold_embeddings || (embedding_group && embedding_group->size() == 2),
        "PipelineExecutor: the first and the last stage need a 2-rank embedding group for the tied embedding");
  pp_group_ = &pp_group;
  embedding_group_ = tied_hooks_->hold_embeddings ? embedding_group : nullptr;
}

void PipelineExecutor::set_grad_runtime(LayerHooks* hooks, std::vector<GradSync*> syncs) {
  tied_hooks_->inner = hooks;
  syncs_ = std::move(syncs);
  // Gradient reductions over other ranks start inside the last micro-step's backward passes
  // (ZeRO 0-1; cuda_graphs_blocker rules out ZeRO 2-3 over several ranks): those computations
  // run op by op, the earlier ones may be recorded.
  const bool collective = std::any_of(syncs_.begin(), syncs_.end(), [](GradSync* s) { return s && s->reduces_across_ranks(); });
  recordable_end_ = collective ? last_micro_start_ : actions_.size();
}

namespace {
// Whether any of `chunks` has `part` (its embedding, its head).
bool any_chunk(const std::vector<StageLayers>& chunks, bool StageLayers::*part) {
  return std::any_of(chunks.begin(), chunks.end(), [&](const StageLayers& s) { return s.*part; });
}
}  // namespace

bool PipelineExecutor::has_embedding() const { return any_chunk(chunk_layers_, &StageLayers::embedding); }

bool PipelineExecutor::has_head() const { return any_chunk(chunk_layers_, &StageLayers::head); }

size_t pipeline_step_buffer_bytes(const std::vector<StageLayers>& chunks, int micro_batches, size_t micro_tokens) {
  const size_t m = static_cast<size_t>(micro_batches), ids = m * micro_tokens * sizeof(int32_t);
  return (any_chunk(chunks, &StageLayers::embedding) ? ids : 0) +
         (any_chunk(chunks, &StageLayers::head) ? ids + m * sizeof(float) : 0);
}

size_t PipelineExecutor::activation_bytes() const {
  size_t n = pipeline_step_buffer_bytes(chunk_layers_, m_, static_cast<size_t>(B_) * T_);
  for (const auto& ch : chunks_) n += ch->activation_bytes();
  return n;
}

double pipeline_bubble_of(const PhaseTimes& t) {
  const double schedule = t[StepPhase::forward] + t[StepPhase::backward] + t[StepPhase::pp_comm];
  return schedule > 0 ? t[StepPhase::pp_comm] / schedule : 0.0;
}

namespace {
StepPhase phase_of(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return StepPhase::forward;
    case PipeOp::backward: return StepPhase::backward;
    default: return StepPhase::pp_comm;
  }
}
}  // namespace

PipelineStepStats PipelineExecutor::train_step(const int32_t* inputs, const int32_t* targets, float dloss,
                                               StepTimeline* timeline) {
  check(!has_embedding() || inputs, "PipelineExecutor: the first stage needs the micro-batches' inputs");
  check(!has_head() || targets, "PipelineExecutor: the last stage needs the micro-batches' targets");
  check(pp_group_ != nullptr, "PipelineExecutor: train_step before connect");
  const size_t N = static_cast<size_t>(B_) * T_;
  PipelineStepStats st;
  if (has_embedding()) ops_.upload(step_tokens_, inputs, DType::i32, m_ * N);
  if (has_head()) {
    ops_.upload(step_targets_, targets, DType::i32, m_ * N);
    st.tokens = static_cast<double>(std::count_if(targets, targets + m_ * N, [](int32_t t) { return t >= 0; }));
  }
  SlotTable slots(actions_, v_);
  size_t first_compute = 0;
  while (first_compute < actions_.size() && !is_compute(actions_[first_compute])) first_compute++;
  for (GradSync* s : syncs_) s->start_micro_step(last_micro_start_ == first_compute);
  bool output_unsent = false;  // a chunk's shared output buffer holds an activation not yet sent
  for (size_t i = 0; i < actions_.size(); i++) {
    const PipeAction& a = actions_[i];
    if (i == last_micro_start_ && i != first_compute)
      for (GradSync* s : syncs_) s->start_micro_step(true);
    DecoderStage& ch = *chunks_[static_cast<size_t>(a.chunk)];
    const int mb = a.micro_batch;
    if (timeline) timeline->enter(phase_of(a.op));
    switch (a.op) {
      case PipeOp::recv_activation:
        pp_group_->recv(ch.input(slots.received(a.chunk, mb)), a.peer);
        break;
      case PipeOp::send_activation:
        pp_group_->send(ch.output(), a.peer);
        output_unsent = false;
        break;
      case PipeOp::recv_grad:
        pp_group_->recv(ch.grad_output(slots.io(a.chunk, mb)), a.peer);
        break;
      case PipeOp::send_grad:
        pp_group_->send(ch.grad_input(slots.io(a.chunk, mb)), a.peer);
        slots.grad_sent(a.chunk, mb);
        break;
      case PipeOp::forward: {
        check(!output_unsent, "internal error: a pipeline computation before the previous output was sent");
        const StageLayers& layers = ch.layers();
        const MicroSlot at = slots.forward(a.chunk, mb);
        const Tensor tok = layers.embedding ? step_tokens_.slice(mb * N, N) : Tensor{};
        const Tensor tgt = layers.head ? step_targets_.slice(mb * N, N) : Tensor{};
        const Tensor loss = layers.head ? loss_sums_.slice(size_t(mb), 1) : Tensor{};
        run_compute(i, ch, at, dloss, [&] { ch.forward(at, tok, tgt, dloss, loss); });
        if (record_ && mb == 0) fingerprints_[static_cast<size_t>(a.chunk)] = forward_fingerprint(ops_, ch);
        output_unsent = !layers.head;
        break;
      }
      case PipeOp::backward: {
        check(!output_unsent, "internal error: a pipeline computation before the previous output was sent");
        const MicroSlot at = slots.backward(a.chunk, mb);
        run_compute(i, ch, at, dloss, [&] { ch.backward(at); });
        slots.backward_done(a.chunk, mb);
        break;
      }
    }
  }
  // The tied embedding: both copies' gradients, each accumulated over every micro-batch, summed
  // over the first and last stage, then reduced over dp x cp like any other layer.
  if (tied_hooks_->hold_embeddings) {
    check(tied_hooks_->embeddings_held, "internal error: the embeddings' gradient was never reported");
    if (timeline) timeline->enter(StepPhase::grad_sync);
    const std::vector<const ParamSpec*> embedding = role_specs(store_.table(), ParamRole::token_embedding, -1);
    check(embedding.size() == 1, "internal error: a stage holding the tied head without the token embedding");
    embedding_group_->all_reduce(store_.grad(*embedding[0]));
    tied_hooks_->embeddings_held = false;
    if (tied_hooks_->inner) tied_hooks_->inner->grads_ready(-1);
  }
  if (has_head()) {  // the micro-batches' loss sums, read once and added in their order
    std::vector<float> sums(static_cast<size_t>(m_));
    ops_.download(sums.data(), DType::f32, loss_sums_, sums.size());
    for (float x : sums) st.loss_sum += x;
  }
  return st;
}

double PipelineExecutor::forward_only(const int32_t* inputs, const int32_t* targets,
                                      std::vector<uint64_t>* fingerprints) {
  check(pp_group_ != nullptr, "PipelineExecutor: forward_only before connect");
  const int stages = pp_ * v_;
  const size_t N = static_cast<size_t>(B_) * T_;
  // The first micro-batch's places on the device (a step uploads its own before it reads them).
  const Tensor tok = has_embedding() ? step_tokens_.slice(0, N) : Tensor{};
  const Tensor tgt = has_head() ? step_targets_.slice(0, N) : Tensor{};
  const Tensor loss_sum = has_head() ? loss_sums_.slice(0, 1) : Tensor{};
  if (tok) ops_.upload(tok, inputs, DType::i32, N);
  if (tgt) ops_.upload(tgt, targets, DType::i32, N);
  double loss = 0;
  if (fingerprints) fingerprints->clear();
  for (int c = 0; c < v_; c++) {
    DecoderStage& ch = *chunks_[static_cast<size_t>(c)];
    const int vs = c * pp_ + rank_;
    if (vs > 0) pp_group_->recv(ch.input(0), (vs - 1) % pp_);
    const StageLayers& layers = ch.layers();
    ch.forward(MicroSlot{}, layers.embedding ? tok : Tensor{}, layers.head ? tgt : Tensor{}, 0.0f,
               layers.head ? loss_sum : Tensor{});
    if (layers.head) {
      float sum = 0;
      ops_.download(&sum, DType::f32, loss_sum, 1);
      loss += sum;
    }
    if (fingerprints) fingerprints->push_back(forward_fingerprint(ops_, ch));
    if (vs + 1 < stages) pp_group_->send(ch.output(), (vs + 1) % pp_);
  }
  return loss;
}

std::vector<float> PipelineExecutor::head_token_losses() {
  for (const auto& ch : chunks_) {
    if (!ch->layers().head) continue;
    const Tensor t = ch->token_losses();
    std::vector<float> out(t.numel);
    ops_.download(out.data(), DType::f32, t, t.numel);
    return out;
  }
  check(false, "internal error: PipelineExecutor::head_token_losses on a rank without the head");
  return {};
}

uint64_t forward_fingerprint(Ops& ops, const DecoderStage& chunk) {
  const Tensor t = chunk.last_hidden();
  std::vector<unsigned char> bytes(t.numel * dtype_size(t.dtype));
  ops.download(bytes.data(), t.dtype, t, t.numel);
  return ckpt::checksum64(bytes.data(), bytes.size());
}

}  // namespace pt
