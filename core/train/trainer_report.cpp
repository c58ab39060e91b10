// Trainer::write_session_report: how a session ends (finished, or stopped by a signal after its
// checkpoint). Every rank contributes its time and host to the report; rank 0 writes it
// (core/report/run_report.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "core/ckpt/stop_signal.h"
#include "core/model/sample_run.h"
#include "core/metrics/process_clock.h"
#include "core/plan/stage_memory.h"
#include "core/report/report_sample.h"
#include "core/report/run_report.h"
#include "core/report/system_info.h"
#include "core/train/trainer.h"
#include "core/common/console.h"

namespace pt {

namespace {

// Steps slower than this many times their session's median are the report's stalls.
constexpr double kStallFactor = 3.0;

// The memory account of the start-up log, one line per pipeline stage.
std::vector<std::string> memory_lines(const RunConfig& cfg, const ParamTable& model, DType compute) {
  std::vector<std::string> lines;
  for (const StageMemory& st : plan_stage_memory(cfg, model, compute))
    lines.push_back((cfg.parallel.pp > 1 ? "stage " + std::to_string(st.pp_rank) + " (" + st.chunks + "): " : "") +
                    st.plan.describe() + ", recompute " + cfg.recompute.mode);
  return lines;
}

}  // namespace

void Trainer::write_session_report(RunSummary s, const std::vector<Stall>& step_ms, SessionLog* sessions,
                                   const std::string& metrics_path) {
  using Clock = std::chrono::steady_clock;
  const bool lead = world_.rank == 0;
  // The report's sample is the log's: logging.sample_every = 0 turns both off. (Decoding reads
  // every weight once per token: 64 tokens of GPT-2 124M on a CPU take about 15 s, which a run
  // with samples turned off should not spend at its end.)
  // The log sampled the final weights already when the run finished with logging.sample_every > 0
  // (every rank knows it): the report shows that sample. A run stopped early samples here: that
  // needs the whole model on one rank, and every rank takes part in gathering it from the ZeRO
  // shards and tensor-parallel pieces. A pipeline stage holds only its layers.
  const bool logged_final = cfg_.parallel.pp == 1 && cfg_.logging.sample_every > 0 && step_ == cfg_.schedule.total_steps;
  if (cfg_.logging.sample_every == 0) {
    s.sample_note = "no sample: logging.sample_every=0 (set it to sample the weights in the log and here)";
  } else if (logged_final) {
    if (final_sample_) {
      const ReportSample sample = report_sample(cfg_, *final_sample_);
      s.sample_text = sample.text;
      s.sample_note = sample.note;
    } else {
      s.sample_note = "no sample: the log had no tokenizer (data.tokenizer=\"" + cfg_.data.tokenizer +
                      "\", model.vocab_size=" + std::to_string(cfg_.model.vocab_size) + "; see its warning)";
    }
  } else if (cfg_.parallel.pp == 1) {
    const auto t0 = Clock::now();
    const std::vector<float> weights = gather_master();
    if (lead) {
      const ReportSample sample = sample_for_report(cfg_, weights.data(), ops_);
      s.sample_text = sample.text;
      s.sample_note = sample.note;
    }
    const double dt = seconds_since(t0);
    time_.sample += dt;
    time_.wall += dt;
  } else {
    s.sample_note = "no sample: the model is split over parallel.pp=" + std::to_string(cfg_.parallel.pp) +
                    " pipeline stages; sample the final checkpoint with `picotrain sample --checkpoint " +
                    cfg_.checkpoint.dir + "`";
  }
  s.sample_prompt = cfg_.logging.sample_prompt;

  // One all_reduce: every rank's time and communication (averaged below) and its host (each
  // rank fills its own slot, so the sum lists them all).
  const CommStats own = *groups_.comm_stats;
  std::vector<double> v = time_.to_vector();
  const size_t t_n = v.size(), k = CommStats::kinds;
  for (size_t i = 0; i < k; i++) v.push_back(own.seconds[i]);
  for (size_t i = 0; i < k; i++) v.push_back(own.bytes[i]);
  for (size_t i = 0; i < k; i++) v.push_back(static_cast<double>(own.calls[i]));
  const size_t hosts_at = v.size();
  v.resize(hosts_at + static_cast<size_t>(world_.size), 0.0);
  v[hosts_at + static_cast<size_t>(world_.rank)] = host_id();
  groups_.world->all_reduce(v.data(), v.size());
  if (!lead) return;

  const double n = world_.size;
  std::vector<double> t(v.begin(), v.begin() + static_cast<long>(t_n));
  for (double& x : t) x /= n;
  s.time = TimeBreakdown::from_vector(t);
  for (size_t i = 0; i < k; i++) {
    s.comm.seconds[i] = v[t_n + i] / n;
    s.comm.bytes[i] = v[t_n + k + i] / n;
    s.comm.calls[i] = static_cast<uint64_t>(v[t_n + 2 * k + i] / n + 0.5);
  }
  std::vector<double> hosts(v.begin() + static_cast<long>(hosts_at), v.end());
  const double mine = hosts[0];
  s.ranks = world_.size;
  s.nodes = 0;
  int on_my_node = 0;
  for (size_t i = 0; i < hosts.size(); i++) {
    on_my_node += hosts[i] == mine;
    s.nodes += std::find(hosts.begin(), hosts.begin() + static_cast<long>(i), hosts[i]) == hosts.begin() + static_cast<long>(i);
  }

  s.cfg = cfg_;
  s.compute_dtype = ops_.compute_dtype() == DType::bf16 ? "bf16" : "fp32";
  s.step = step_;
  s.finished = step_ >= cfg_.schedule.total_steps;
  s.final_checkpoint = final_checkpoint();
  if (!s.finished) {
    const int sig = ckpt::stop_signal();
    s.stop_reason = std::string(sig ? ckpt::signal_name(sig) : "a signal to another rank") + " after step " +
                    std::to_string(step_) + "/" + std::to_string(cfg_.schedule.total_steps);
  }
  s.device = ops_.device_description();
  s.gpu = ops_.device() == Device::cuda;
  const Interconnect ic = detect_interconnect(s.gpu, on_my_node, s.nodes);
  s.interconnect_node = ic.within_node;
  s.interconnect_network = ic.between_nodes;
  s.params = static_cast<double>(table_.total_numel());
  s.memory = memory_lines(cfg_, table_, ops_.compute_dtype());
  s.stalls = find_stalls(step_ms, kStallFactor, &s.median_step_ms);

  // The run is checkpointed by now: a report that cannot be written is a warning, not a failure.
  try {
    if (sessions) sessions->end(s);
    if (sessions) write_run_report(s, metrics_path, *sessions);
    print_line(Stream::out, "report    | " + (std::filesystem::path(cfg_.run.out_dir) / "report.md").string());
  } catch (const std::exception& e) {
    print_warning(std::string("the run report could not be written: ") + e.what());
  }
}

}  // namespace pt
