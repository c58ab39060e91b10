#include "core/report/session_log.h"

#include <ctime>
#include <fstream>

#include "core/common/error.h"

namespace pt {

using nlohmann::json;

json to_json(const TimeBreakdown& t) {
  json phases = json::object();
  for (int p = 0; p < kStepPhases; p++) phases[step_phase_name(static_cast<StepPhase>(p))] = t.phases[p];
  return {{"wall_s", t.wall},     {"steps_s", t.steps},           {"compute_s", t.compute()},
          {"comm_s", t.comm},     {"bubble_s", t.bubble},         {"data_s", t.data},
          {"checkpoint_s", t.checkpoint}, {"eval_s", t.eval},     {"sample_s", t.sample},
          {"other_s", t.other()}, {"steps", t.step_count},        {"checkpoints", t.checkpoints},
          {"device_phases_s", phases}};
}

json to_json(const CommStats& c) {
  json j = json::object();
  for (int k = 0; k < CommStats::kinds; k++)
    if (c.calls[k] > 0)
      j[comm_kind_name(static_cast<CommKind>(k))] = {{"seconds", c.seconds[k]}, {"bytes", c.bytes[k]}, {"calls", c.calls[k]}};
  return j;
}

namespace {

TimeBreakdown breakdown_from_json(const json& j) {
  TimeBreakdown t;
  t.wall = j.value("wall_s", 0.0);
  t.steps = j.value("steps_s", 0.0);
  t.comm = j.value("comm_s", 0.0);
  t.bubble = j.value("bubble_s", 0.0);
  t.data = j.value("data_s", 0.0);
  t.checkpoint = j.value("checkpoint_s", 0.0);
  t.eval = j.value("eval_s", 0.0);
  t.sample = j.value("sample_s", 0.0);
  t.step_count = j.value("steps", 0);
  t.checkpoints = j.value("checkpoints", 0);
  const json phases = j.value("device_phases_s", json::object());  // absent in older run directories
  for (int p = 0; p < kStepPhases; p++) t.phases[p] = phases.value(step_phase_name(static_cast<StepPhase>(p)), 0.0);
  return t;
}

}  // namespace

SessionLog::SessionLog(std::string path, bool fresh) : path_(std::move(path)) {
  if (!fresh) return;
  std::ofstream out(path_, std::ios::trunc);
  check(out.good(), "cannot open " + path_ + " for writing");
}

void SessionLog::append(const json& record) {
  std::ofstream out(path_, std::ios::app);
  out << record.dump() << '\n';
  out.flush();
  check(out.good(), "writing " + path_ + " failed (disk full?)");
}

void SessionLog::start(int step, const std::string& resumed_from) {
  append({{"event", "start"}, {"step", step}, {"resumed_from", resumed_from}, {"unix_time", std::time(nullptr)}});
}

void SessionLog::end(const RunSummary& s) {
  json stalls = json::array();
  for (const Stall& st : s.stalls) stalls.push_back({{"step", st.step}, {"ms", st.ms}});
  append({{"event", "end"},
          {"step", s.step},
          {"finished", s.finished},
          {"stop_reason", s.stop_reason},
          {"unix_time", std::time(nullptr)},
          {"time", to_json(s.time)},
          {"comm", to_json(s.comm)},
          {"median_step_ms", s.median_step_ms},
          {"stalls", stalls}});
}

std::vector<json> SessionLog::records() const {
  std::vector<json> out;
  std::ifstream in(path_);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("event")) out.push_back(std::move(j));
  }
  return out;
}

SessionTotals sum_sessions(const std::vector<json>& records) {
  SessionTotals t;
  bool open = false;  // a start not yet ended
  for (const json& r : records) {
    const std::string event = r.value("event", "");
    if (event == "start") {
      t.crashed += open;
      t.sessions++;
      open = true;
    } else if (event == "end" && open) {
      open = false;
      const TimeBreakdown b = breakdown_from_json(r.value("time", json::object()));
      std::vector<double> sum = t.time.to_vector();
      const std::vector<double> add = b.to_vector();
      for (size_t i = 0; i < sum.size(); i++) sum[i] += add[i];
      t.time = TimeBreakdown::from_vector(sum);
      const json comm = r.value("comm", json::object());
      for (const auto& [kind, v] : comm.items())
        for (int k = 0; k < CommStats::kinds; k++)
          if (kind == comm_kind_name(static_cast<CommKind>(k))) {
            t.comm.seconds[k] += v.value("seconds", 0.0);
            t.comm.bytes[k] += v.value("bytes", 0.0);
            t.comm.calls[k] += v.value("calls", uint64_t{0});
          }
      for (const json& st : r.value("stalls", json::array())) t.stalls.push_back({st.value("step", 0), st.value("ms", 0.0)});
    }
  }
  // The last session still open is the one writing the report only if the caller has not
  // ended it yet; SessionLog::end comes first, so an open one here crashed.
  t.crashed += open;
  t.restarts = t.sessions > 0 ? t.sessions - 1 : 0;
  return t;
}

}  // namespace pt
