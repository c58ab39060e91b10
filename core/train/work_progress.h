// The progress line of a long piece of work outside the training steps (a validation pass):
// nothing for work that ends within the first interval, then one line every `interval_s`
// seconds with how far it is and an ETA from the pace so far, e.g.
//   "val       | 8/17 batches in 10 s, ETA 11s"
// The clock is the caller's (seconds since the work started), so tests drive it directly.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "core/common/format.h"
#include "core/metrics/metrics_log.h"

namespace pt {

class WorkProgress {
 public:
  // label: the log's column ("val"); unit: what is counted ("batches").
  WorkProgress(std::string label, std::string unit, int64_t total, double interval_s = 10.0)
      : label_(std::move(label)), unit_(std::move(unit)), total_(total), interval_s_(interval_s) {}

  // After `done` of the total, `elapsed_s` seconds in: the line to print now, if one is due. None
  // once the work is done (the caller's own closing line says that).
  std::optional<std::string> update(int64_t done, double elapsed_s) {
    if (done >= total_ || elapsed_s - said_at_ < interval_s_ || done <= 0) return std::nullopt;
    said_at_ = elapsed_s;
    const double left = elapsed_s / static_cast<double>(done) * static_cast<double>(total_ - done);
    std::string line = label_;
    line.resize(10, ' ');
    return line + format("| %lld/%lld %s in %.0f s, ETA %s", static_cast<long long>(done),
                         static_cast<long long>(total_), unit_.c_str(), elapsed_s, format_duration(left).c_str());
  }

 private:
  std::string label_, unit_;
  int64_t total_;
  double interval_s_;
  double said_at_ = 0;
};

}  // namespace pt
