// Pipeline schedules: the compute order of each kind, then one shared rule that places the
// sends and receives (see the header for the rule and why it cannot deadlock).
#include "core/train/pp_schedule.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "core/common/error.h"

namespace pt {

namespace {

struct Shape {
  int pp, v, m;
  int stages() const { return pp * v; }
  int total() const { return v * m; }  // forwards (and backwards) per rank
  int owner(int stage) const { return stage % pp; }
  int stage(int rank, int chunk) const { return chunk * pp + rank; }
};

// The k-th forward (backward) of a rank. Micro-batches go through the chunks in groups of pp:
// chunk 0 of micro-batches 0..pp-1, chunk 1 of the same, ..., then the next group; backwards
// walk the chunks in reverse, because the gradient enters at the last chunk. With v = 1 this
// is simply micro-batch k, so every kind shares it.
PipeAction walk(const Shape& sh, int k, bool backward) {
  int per_group = sh.pp * sh.v;
  int in_group = k % per_group;
  int chunk = in_group / sh.pp;
  int micro = (k / per_group) * sh.pp + in_group % sh.pp;
  if (backward) chunk = sh.v - 1 - chunk;
  return {backward ? PipeOp::backward : PipeOp::forward, micro, chunk, -1};
}

// Forwards run before the first backward. afab: all of them. 1f1b: enough that the first
// micro-batch's gradient arrives just as the warm-up ends (one per downstream rank).
// interleaved (Megatron): the gradient's round trip to the last rank and back takes two slots
// per downstream rank, plus a full group of pp for each extra chunk. With m == pp every
// forward goes first, as in Megatron: the bubble is the same, and with blocking sends and a
// backward slower than the forward it is exact where the short 1F1B phase would stall
// (pp=4, v=2, m=4, B=2F: 37.5% against 50%), for at most a few more activations held.
int warmup_forwards(PipeSchedule kind, const Shape& sh, int rank) {
  switch (kind) {
    case PipeSchedule::afab: return sh.total();
    case PipeSchedule::one_f_one_b: return std::min(sh.pp - rank - 1, sh.total());
    case PipeSchedule::interleaved:
      if (sh.m == sh.pp) return sh.total();
      return std::min((sh.pp - rank - 1) * 2 + (sh.v - 1) * sh.pp, sh.total());
  }
  return sh.total();
}

std::vector<PipeAction> compute_order(PipeSchedule kind, const Shape& sh, int rank) {
  const int total = sh.total(), warmup = warmup_forwards(kind, sh, rank);
  std::vector<PipeAction> out;
  out.reserve(2 * total);
  for (int k = 0; k < warmup; k++) out.push_back(walk(sh, k, false));
  for (int k = 0; k + warmup < total; k++) {
    out.push_back(walk(sh, warmup + k, false));
    out.push_back(walk(sh, k, true));
  }
  for (int k = total - warmup; k < total; k++) out.push_back(walk(sh, k, true));
  return out;
}

// When each computation runs if nothing but data dependencies holds a rank back
// (communication free and never blocking), with every computation one time unit long. Unit
// costs put all ranks on one integer clock, so a message is handed over the moment it is
// produced and a blocking send meets its receive without stalling anyone: the schedule then
// runs exactly this timeline. Any costs give a deadlock-free order (see the header); for afab
// and 1f1b the order is also exact for backward != forward, for interleaved only with
// non-blocking sends (the simulator tests both).
struct Timeline {
  static constexpr int64_t kUnknown = -1;
  std::vector<int64_t> fwd_end, bwd_end;  // [stage * m + micro]
  std::vector<std::vector<int64_t>> start;  // [rank][index in its compute order]
};

Timeline unit_cost_timeline(const Shape& sh, const std::vector<std::vector<PipeAction>>& orders) {
  Timeline t;
  const size_t cells = static_cast<size_t>(sh.stages()) * sh.m;
  t.fwd_end.assign(cells, Timeline::kUnknown);
  t.bwd_end.assign(cells, Timeline::kUnknown);
  t.start.resize(sh.pp);
  auto at = [&](int stage, int micro) { return static_cast<size_t>(stage) * sh.m + micro; };
  std::vector<int64_t> clock(sh.pp, 0);
  size_t remaining = 0;
  for (const auto& o : orders) remaining += o.size();
  while (remaining > 0) {
    const size_t before = remaining;
    for (int r = 0; r < sh.pp; r++) {
      for (size_t i = t.start[r].size(); i < orders[r].size(); i++) {
        const PipeAction& a = orders[r][i];
        const int s = sh.stage(r, a.chunk), mb = a.micro_batch;
        const bool fwd = a.op == PipeOp::forward;
        // Forward: stage s-1's forward. Backward: its own forward and stage s+1's backward.
        int64_t ready = 0;
        if (fwd && s > 0) ready = t.fwd_end[at(s - 1, mb)];
        if (!fwd) ready = t.fwd_end[at(s, mb)];
        if (!fwd && ready != Timeline::kUnknown && s + 1 < sh.stages()) ready = t.bwd_end[at(s + 1, mb)];
        if (ready == Timeline::kUnknown) break;
        t.start[r].push_back(std::max(clock[r], ready));
        clock[r] = t.start[r].back() + 1;
        (fwd ? t.fwd_end : t.bwd_end)[at(s, mb)] = clock[r];
        remaining--;
      }
    }
    // Cannot happen for the kinds above (the simulator tests prove it); guards future kinds.
    check(remaining < before, "internal error: the pipeline compute order has a dependency cycle");
  }
  return t;
}

// Interleaves a rank's computations with its sends and receives by the ordering rule: items
// sort by (time, communication before computation, message tie-break); a computation's time is
// its start, a message's the end of the computation that produces it.
std::vector<PipeAction> with_communication(const Shape& sh, int rank, const std::vector<PipeAction>& order,
                                           const Timeline& t) {
  using Key = std::tuple<int64_t, int, int, int, int, size_t>;  // time, class, kind, stage, micro, index
  std::vector<std::pair<Key, PipeAction>> items;
  auto at = [&](int stage, int micro) { return static_cast<size_t>(stage) * sh.m + micro; };
  // An activation goes from stage `from` to from+1, a gradient from `from` to from-1.
  auto message = [&](PipeOp op, bool grad, int from, int mb, int chunk) {
    const int to = grad ? from - 1 : from + 1;
    const int64_t when = (grad ? t.bwd_end : t.fwd_end)[at(from, mb)];
    const int peer = sh.owner(from) == rank ? sh.owner(to) : sh.owner(from);
    items.push_back({Key{when, 0, grad, from, mb, 0}, PipeAction{op, mb, chunk, peer}});
  };
  for (size_t i = 0; i < order.size(); i++) {
    const PipeAction& a = order[i];
    const int s = sh.stage(rank, a.chunk), mb = a.micro_batch;
    items.push_back({Key{t.start[rank][i], 1, 0, 0, 0, i}, a});
    const bool has_prev = s > 0 && sh.owner(s - 1) != rank;
    const bool has_next = s + 1 < sh.stages() && sh.owner(s + 1) != rank;
    if (a.op == PipeOp::forward) {
      if (has_prev) message(PipeOp::recv_activation, false, s - 1, mb, a.chunk);
      if (has_next) message(PipeOp::send_activation, false, s, mb, a.chunk);
    } else {
      if (has_next) message(PipeOp::recv_grad, true, s + 1, mb, a.chunk);
      if (has_prev) message(PipeOp::send_grad, true, s, mb, a.chunk);
    }
  }
  std::sort(items.begin(), items.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<PipeAction> out;
  out.reserve(items.size());
  for (auto& [key, a] : items) out.push_back(a);
  return out;
}

std::vector<std::vector<PipeAction>> all_compute_orders(PipeSchedule kind, const Shape& sh) {
  std::vector<std::vector<PipeAction>> orders;
  for (int r = 0; r < sh.pp; r++) orders.push_back(compute_order(kind, sh, r));
  return orders;
}

void check_rank(int pp, int rank) {
  if (rank < 0 || rank >= pp)
    throw RuntimeError("pipeline rank " + std::to_string(rank) + " is outside 0.." + std::to_string(pp - 1));
}

}  // namespace

PipeSchedule parse_pipe_schedule(std::string_view name) {
  if (name == "afab") return PipeSchedule::afab;
  if (name == "1f1b") return PipeSchedule::one_f_one_b;
  if (name == "interleaved") return PipeSchedule::interleaved;
  throw ConfigError("parallel.pp_schedule=\"" + std::string(name) + "\" must be one of afab, 1f1b, interleaved");
}

std::string_view to_string(PipeSchedule kind) {
  switch (kind) {
    case PipeSchedule::afab: return "afab";
    case PipeSchedule::one_f_one_b: return "1f1b";
    case PipeSchedule::interleaved: return "interleaved";
  }
  return "?";
}

std::string to_string(const PipeAction& a) {
  static constexpr const char* names[] = {"forward",   "backward",          "send_activation",
                                          "recv_activation", "send_grad", "recv_grad"};
  std::ostringstream s;
  s << names[static_cast<int>(a.op)] << "(micro " << a.micro_batch << ", chunk " << a.chunk << ")";
  if (a.op == PipeOp::send_activation || a.op == PipeOp::send_grad) s << " -> rank " << a.peer;
  if (a.op == PipeOp::recv_activation || a.op == PipeOp::recv_grad) s << " <- rank " << a.peer;
  return s.str();
}

void check_pipeline_schedule(PipeSchedule kind, int pp, int v, int m) {
  const std::string name(to_string(kind));
  if (pp < 1) throw ConfigError("parallel.pp=" + std::to_string(pp) + " must be >= 1");
  if (m < 1)
    throw ConfigError("the micro-batch count batch.grad_accum_steps=" + std::to_string(m) + " must be >= 1");
  if (kind != PipeSchedule::interleaved) {
    if (v != 1)
      throw ConfigError("parallel.pp_virtual_stages=" + std::to_string(v) + " must be 1 when parallel.pp_schedule=\"" +
                        name + "\" (only \"interleaved\" uses virtual stages)");
    return;
  }
  if (pp < 2)
    throw ConfigError("parallel.pp=" + std::to_string(pp) + " must be >= 2 when parallel.pp_schedule=\"interleaved\"");
  if (v < 2)
    throw ConfigError("parallel.pp_virtual_stages=" + std::to_string(v) +
                      " must be >= 2 when parallel.pp_schedule=\"interleaved\"");
  // Megatron's rule: micro-batches enter the chunks in groups of pp, so a partial group would
  // leave a rank waiting on a chunk that never comes.
  if (m % pp != 0)
    throw ConfigError("parallel.pp_schedule=\"interleaved\" needs the micro-batch count batch.grad_accum_steps=" +
                      std::to_string(m) + " to be a multiple of parallel.pp=" + std::to_string(pp) +
                      " (micro-batches go through the model chunks in groups of pp); change batch.global_batch_tokens "
                      "or batch.micro_batch_size, or use parallel.pp_schedule=\"1f1b\"");
}

std::vector<PipeAction> pipeline_compute_order(PipeSchedule kind, int pp, int v, int m, int rank) {
  check_pipeline_schedule(kind, pp, v, m);
  check_rank(pp, rank);
  return compute_order(kind, Shape{pp, v, m}, rank);
}

std::vector<std::vector<PipeAction>> pipeline_schedule_all_ranks(PipeSchedule kind, int pp, int v, int m) {
  check_pipeline_schedule(kind, pp, v, m);
  const Shape sh{pp, v, m};
  const auto orders = all_compute_orders(kind, sh);
  const Timeline t = unit_cost_timeline(sh, orders);
  std::vector<std::vector<PipeAction>> out;
  for (int r = 0; r < pp; r++) out.push_back(with_communication(sh, r, orders[r], t));
  return out;
}

const std::vector<std::vector<PipeAction>>& shared_pipeline_schedule(PipeSchedule kind, int pp, int v, int m) {
  static std::mutex mutex;
  static std::map<std::tuple<PipeSchedule, int, int, int>, std::vector<std::vector<PipeAction>>> built;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(kind, pp, v, m);
  auto it = built.find(key);
  if (it == built.end()) it = built.emplace(key, pipeline_schedule_all_ranks(kind, pp, v, m)).first;
  return it->second;  // a std::map never moves its elements
}

std::vector<PipeAction> pipeline_schedule(PipeSchedule kind, int pp, int v, int m, int rank) {
  check_pipeline_schedule(kind, pp, v, m);
  check_rank(pp, rank);
  // The keys of the ordering rule depend on every rank's computations, so all are built;
  // that is O(pp*v*m) small structs, once per run.
  return pipeline_schedule_all_ranks(kind, pp, v, m)[rank];
}

}  // namespace pt
