// Pipeline simulator: an event loop over per-rank program counters and clocks. Each pass
// advances every rank as far as it can; a pass in which nobody moves, with work left, is a
// deadlock. Every send can meet exactly one receive (tagless links deliver in order), so the
// times do not depend on the order in which ranks are visited.
#include "core/train/pp_simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#include <sstream>

#include "core/common/error.h"

namespace pt {

namespace {

bool is_send(PipeOp op) { return op == PipeOp::send_activation || op == PipeOp::send_grad; }
bool is_recv(PipeOp op) { return op == PipeOp::recv_activation || op == PipeOp::recv_grad; }

// An activation (produced by a forward) or a gradient (by a backward) of one micro-batch, named
// by the virtual stage that produced it.
struct Message {
  bool grad;
  int producer_stage;
  int micro;
  bool operator==(const Message&) const = default;
};

// The first rule violation ends the simulation; this carries it out of the loop.
struct Invalid {
  std::string why;
};

constexpr double kNotYet = -1.0;

// What a rank knows about one input (activation or output gradient) of one (stage, micro).
struct Arrival {
  bool posted = false;     // its receive has been issued
  double ready = kNotYet;  // when the data is there
};

class Simulator {
 public:
  Simulator(const std::vector<std::vector<PipeAction>>& ranks, int v, int m, PipeCosts costs, PipeComm comm)
      : ranks_(ranks), pp_(static_cast<int>(ranks.size())), v_(v), m_(m), costs_(costs), comm_(comm) {
    const size_t cells = static_cast<size_t>(pp_) * v_ * m_;
    fwd_end_.assign(cells, kNotYet);
    bwd_end_.assign(cells, kNotYet);
    input_.resize(cells);
    grad_.resize(cells);
    pc_.assign(pp_, 0);
    clock_.assign(pp_, 0.0);
    in_flight_.assign(pp_, 0);
    sent_.resize(static_cast<size_t>(pp_) * pp_);
    posted_.resize(static_cast<size_t>(pp_) * pp_);
    report_.busy.assign(pp_, 0.0);
    report_.peak_in_flight.assign(pp_, 0);
    report_.timeline.resize(pp_);
  }

  PipeSimReport run() {
    if (pp_ < 1 || v_ < 1 || m_ < 1) return fail(PipeSimReport::Status::invalid, "empty pipeline shape");
    try {
      while (!all_done()) {
        bool moved = false;
        for (int r = 0; r < pp_; r++)
          while (pc_[r] < ranks_[r].size() && step(r)) moved = true;
        if (!moved) return fail(PipeSimReport::Status::deadlock, deadlock_message());
      }
      check_complete();
    } catch (const Invalid& e) {
      return fail(PipeSimReport::Status::invalid, e.why);
    }
    report_.makespan = *std::max_element(clock_.begin(), clock_.end());
    for (int r = 0; r < pp_; r++) report_.idle.push_back(report_.makespan - report_.busy[r]);
    return report_;
  }

 private:
  int stages() const { return pp_ * v_; }
  int owner(int stage) const { return stage % pp_; }
  size_t cell(int stage, int micro) const { return static_cast<size_t>(stage) * m_ + micro; }
  size_t link(int from, int to) const { return static_cast<size_t>(from) * pp_ + to; }
  bool done(int r) const { return pc_[r] >= ranks_[r].size(); }
  bool all_done() const {
    for (int r = 0; r < pp_; r++)
      if (!done(r)) return false;
    return true;
  }
  const PipeAction& head(int r) const { return ranks_[r][pc_[r]]; }

  [[noreturn]] void invalid(int r, const PipeAction& a, const std::string& why) const {
    throw Invalid{"rank " + std::to_string(r) + " " + to_string(a) + ": " + why};
  }

  // The virtual stage the action runs at, after checking its fields.
  int stage_of(int r, const PipeAction& a) const {
    if (a.micro_batch < 0 || a.micro_batch >= m_) invalid(r, a, "micro-batch out of range");
    if (a.chunk < 0 || a.chunk >= v_) invalid(r, a, "chunk out of range");
    return a.chunk * pp_ + r;
  }

  // The message a communication action carries, after checking it names the right peer.
  Message message_of(int r, const PipeAction& a) const {
    const int s = stage_of(r, a);
    const bool grad = a.op == PipeOp::send_grad || a.op == PipeOp::recv_grad;
    // Activations go to stage s+1, gradients to s-1; a receive names where its data comes from.
    const int other = (a.op == PipeOp::send_activation || a.op == PipeOp::recv_grad) ? s + 1 : s - 1;
    if (other < 0 || other >= stages()) invalid(r, a, "there is no virtual stage " + std::to_string(other));
    if (owner(other) == r) invalid(r, a, "the neighbouring stage is on this rank: no message is needed");
    if (a.peer != owner(other))
      invalid(r, a, "the neighbouring stage " + std::to_string(other) + " is on rank " + std::to_string(owner(other)));
    return {grad, is_send(a.op) ? s : other, a.micro_batch};
  }

  [[noreturn]] void wrong_message(int sender, const Message& sent, int receiver, const PipeAction& recv) const {
    throw Invalid{"rank " + std::to_string(receiver) + " " + to_string(recv) + " would get the " +
                  (sent.grad ? "gradient" : "activation") + " of micro-batch " + std::to_string(sent.micro) +
                  " from virtual stage " + std::to_string(sent.producer_stage) + " that rank " +
                  std::to_string(sender) +
                  " sends: tagless matching would deliver the wrong data (the two ranks order this link differently)"};
  }

  Arrival& arrival(int receiver, const PipeAction& recv, const Message& msg) {
    return (msg.grad ? grad_ : input_)[cell(stage_of(receiver, recv), msg.micro)];
  }

  // Runs rank r's next action if it can; false when it has to wait.
  bool step(int r) {
    const PipeAction& a = head(r);
    if (a.op == PipeOp::forward || a.op == PipeOp::backward) return compute(r, a);
    const Message msg = message_of(r, a);
    if (is_send(a.op)) {
      const size_t c = cell(msg.producer_stage, msg.micro);
      if ((msg.grad ? bwd_end_[c] : fwd_end_[c]) == kNotYet) invalid(r, a, "sends data it has not computed yet");
      if (comm_ == PipeComm::blocking) return rendezvous(r, a.peer);
      sent_[link(r, a.peer)].push_back({msg, clock_[r]});
      pc_[r]++;
      pair_up(r, a.peer);
      return true;
    }
    if (comm_ == PipeComm::async) {
      arrival(r, a, msg).posted = true;
      posted_[link(a.peer, r)].push_back({r, a});
      pc_[r]++;
      pair_up(a.peer, r);
      return true;
    }
    // A blocking receive moves only together with its sender's send.
    if (done(a.peer)) return false;
    const PipeAction& other = head(a.peer);
    return is_send(other.op) && other.peer == r && rendezvous(a.peer, r);
  }

  bool rendezvous(int sender, int receiver) {
    if (done(receiver)) return false;
    const PipeAction& send = head(sender);
    const PipeAction& recv = head(receiver);
    if (!is_recv(recv.op) || recv.peer != sender) return false;
    const Message sent = message_of(sender, send);
    if (!(sent == message_of(receiver, recv))) wrong_message(sender, sent, receiver, recv);
    clock_[sender] = clock_[receiver] = std::max(clock_[sender], clock_[receiver]);
    Arrival& in = arrival(receiver, recv, sent);
    in.posted = true;
    in.ready = clock_[receiver];
    pc_[sender]++;
    pc_[receiver]++;
    return true;
  }

  // Async: matches the oldest unmatched send on a link with its oldest unmatched receive.
  void pair_up(int from, int to) {
    auto& sends = sent_[link(from, to)];
    auto& recvs = posted_[link(from, to)];
    while (!sends.empty() && !recvs.empty()) {
      const auto& [msg, when] = sends.front();
      const auto& [receiver, recv] = recvs.front();
      if (!(msg == message_of(receiver, recv))) wrong_message(from, msg, receiver, recv);
      arrival(receiver, recv, msg).ready = when;
      sends.pop_front();
      recvs.pop_front();
    }
  }

  // When the input a computation needs from a neighbouring stage is there, or kNotYet.
  // `local` inputs come from a stage on this rank (pp = 1) and need no message.
  double input_ready(int r, const PipeAction& a, int from_stage, double local_end, const Arrival& in,
                     const char* what) const {
    if (owner(from_stage) == r) {
      if (local_end == kNotYet) invalid(r, a, std::string("runs before stage ") + std::to_string(from_stage) +
                                                  " computed its " + what);
      return local_end;
    }
    if (!in.posted) invalid(r, a, std::string("runs without receiving its ") + what + " from stage " +
                                      std::to_string(from_stage));
    return in.ready;
  }

  bool compute(int r, const PipeAction& a) {
    const int s = stage_of(r, a);
    const size_t c = cell(s, a.micro_batch);
    const bool fwd = a.op == PipeOp::forward;
    double ready = 0;
    if (fwd) {
      if (fwd_end_[c] != kNotYet) invalid(r, a, "forwarded twice");
      // Stage 0 reads the data; otherwise the input comes from stage s-1.
      if (s > 0) ready = input_ready(r, a, s - 1, fwd_end_[cell(s - 1, a.micro_batch)], input_[c], "input activation");
    } else {
      if (bwd_end_[c] != kNotYet) invalid(r, a, "backwarded twice");
      if (fwd_end_[c] == kNotYet) invalid(r, a, "runs before its own forward");
      // The last stage's gradient is its loss's; otherwise it comes from stage s+1.
      if (s + 1 < stages())
        ready = input_ready(r, a, s + 1, bwd_end_[cell(s + 1, a.micro_batch)], grad_[c], "output gradient");
    }
    if (ready == kNotYet) {
      // Blocking receives complete before the computation is reached; only async ones wait here.
      if (comm_ == PipeComm::blocking) invalid(r, a, "its input never arrived");
      return false;
    }
    const double start = std::max(clock_[r], ready);
    const double cost =
        (fwd ? costs_.forward : costs_.backward) * (costs_.rank_scale.empty() ? 1.0 : costs_.rank_scale[size_t(r)]);
    clock_[r] = start + cost;
    report_.busy[r] += cost;
    (fwd ? fwd_end_ : bwd_end_)[c] = clock_[r];
    in_flight_[r] += fwd ? 1 : -1;
    report_.peak_in_flight[r] = std::max(report_.peak_in_flight[r], in_flight_[r]);
    report_.timeline[r].push_back({a, start, clock_[r]});
    pc_[r]++;
    return true;
  }

  void check_complete() const {
    for (int from = 0; from < pp_; from++)
      for (int to = 0; to < pp_; to++) {
        if (!sent_[link(from, to)].empty())
          throw Invalid{"rank " + std::to_string(from) + " sends rank " + std::to_string(to) +
                        " a message that is never received"};
        if (!posted_[link(from, to)].empty())
          throw Invalid{"rank " + std::to_string(to) + " " + to_string(posted_[link(from, to)].front().second) +
                        " is never sent"};
      }
    for (int s = 0; s < stages(); s++)
      for (int mb = 0; mb < m_; mb++) {
        const char* missing = fwd_end_[cell(s, mb)] == kNotYet   ? "forwarded"
                              : bwd_end_[cell(s, mb)] == kNotYet ? "backwarded"
                                                                 : nullptr;
        if (missing)
          throw Invalid{"micro-batch " + std::to_string(mb) + " is never " + missing + " at virtual stage " +
                        std::to_string(s) + " (rank " + std::to_string(owner(s)) + ", chunk " +
                        std::to_string(s / pp_) + ")"};
      }
  }

  std::string deadlock_message() const {
    std::ostringstream s;
    s << "deadlock: no rank can move;";
    for (int r = 0; r < pp_; r++) {
      if (done(r))
        s << " rank " << r << " has finished;";
      else
        s << " rank " << r << " waits at " << to_string(head(r)) << " (action " << pc_[r] << ");";
    }
    return s.str();
  }

  PipeSimReport fail(PipeSimReport::Status status, std::string why) const {
    PipeSimReport r;
    r.status = status;
    r.error = std::move(why);
    return r;
  }

  const std::vector<std::vector<PipeAction>>& ranks_;
  int pp_, v_, m_;
  PipeCosts costs_;
  PipeComm comm_;
  std::vector<double> fwd_end_, bwd_end_;  // [stage][micro]: when it finished, kNotYet before
  std::vector<Arrival> input_, grad_;      // [stage][micro]: at the rank that owns the stage
  std::vector<size_t> pc_;
  std::vector<double> clock_;
  std::vector<int> in_flight_;
  // Async only, per link [from * pp + to]: sends not yet received, receives not yet matched.
  std::vector<std::deque<std::pair<Message, double>>> sent_;
  std::vector<std::deque<std::pair<int, PipeAction>>> posted_;
  PipeSimReport report_;
};

}  // namespace

double PipeSimReport::bubble_ratio() const {
  const double b = std::accumulate(busy.begin(), busy.end(), 0.0);
  return b > 0 ? std::accumulate(idle.begin(), idle.end(), 0.0) / b : 0.0;
}

double PipeSimReport::bubble_fraction() const {
  const double total = makespan * static_cast<double>(busy.size());
  return total > 0 ? std::accumulate(idle.begin(), idle.end(), 0.0) / total : 0.0;
}

PipeSimReport simulate_pipeline(const std::vector<std::vector<PipeAction>>& ranks, int virtual_stages,
                                int micro_batches, PipeCosts costs, PipeComm comm) {
  check(costs.rank_scale.empty() || costs.rank_scale.size() == ranks.size(),
        "simulate_pipeline: rank_scale needs one factor per pipeline rank");
  return Simulator(ranks, virtual_stages, micro_batches, costs, comm).run();
}

std::string format_pipeline_timeline(const PipeSimReport& report, int v) {
  const auto width = static_cast<size_t>(std::lround(report.makespan));
  std::ostringstream out;
  for (size_t r = 0; r < report.timeline.size(); r++)
    for (int c = 0; c < v; c++) {
      std::string row(width, '.');
      for (const PipeSlot& slot : report.timeline[r]) {
        if (slot.action.chunk != c) continue;
        const int mb = slot.action.micro_batch;
        const char mark = slot.action.op == PipeOp::forward ? (mb < 10 ? char('0' + mb) : '+')
                                                            : (mb < 26 ? char('a' + mb) : '-');
        const auto begin = static_cast<size_t>(std::lround(slot.start));
        const auto end = std::min(width, static_cast<size_t>(std::lround(slot.end)));
        for (size_t t = begin; t < end; t++) row[t] = mark;
      }
      out << "rank " << r;
      if (v > 1) out << " chunk " << c;
      out << "  " << row << "\n";
    }
  return out.str();
}

}  // namespace pt
