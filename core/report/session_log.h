// sessions.jsonl in the run directory: one line when a session of the run starts (fresh or
// resumed) and one when it ends cleanly (finished, or stopped by a signal), with that session's
// time breakdown. A session that crashed or was killed has a start and no end. The run report
// adds the sessions up: restarts, crashes, and where the time of the whole run went.
//
// A run started with checkpoint.resume=none starts a new file; any other start appends to it,
// so a run resumed after a crash keeps its history (as metrics.jsonl does).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/report/run_summary.h"

namespace pt {

class SessionLog {
 public:
  // path: <out_dir>/sessions.jsonl; fresh: start a new file.
  SessionLog(std::string path, bool fresh);
  // Appended at once (flushed), so a crash later leaves it on disk.
  void start(int step, const std::string& resumed_from);
  void end(const RunSummary& s);
  // Every record of the file, in order (unparsable lines skipped).
  std::vector<nlohmann::json> records() const;
  const std::string& path() const { return path_; }

 private:
  void append(const nlohmann::json& record);
  std::string path_;
};

// The run's sessions summed up, from `records` (SessionLog::records).
struct SessionTotals {
  int sessions = 0;   // starts
  int restarts = 0;   // sessions after the first
  int crashed = 0;    // starts with no end before the next start
  TimeBreakdown time; // summed over the ended sessions
  CommStats comm;     // summed over the ended sessions
  std::vector<Stall> stalls;
};
SessionTotals sum_sessions(const std::vector<nlohmann::json>& records);

// JSON of a breakdown and of communication stats (the session record's and the report's).
nlohmann::json to_json(const TimeBreakdown& t);
nlohmann::json to_json(const CommStats& c);

}  // namespace pt
