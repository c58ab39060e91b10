// `prepare`'s progress line on stderr: input read, text and tokens so far, throughput, ETA.
// Updated in place about twice a second on a terminal; in a log (not a terminal), one line every
// 10 s. Nothing is printed for work that takes under a second.
#pragma once
#include <chrono>
#include <cstdint>

namespace pt {

class PrepareProgress {
 public:
  explicit PrepareProgress(uint64_t disk_total);
  // disk_done: input bytes read from disk (compressed for .gz), of disk_total.
  void update(uint64_t disk_done, uint64_t text_bytes, uint64_t tokens);
  // The closing line (with the totals), when a progress line was printed.
  void finish(uint64_t text_bytes, uint64_t tokens);
  double seconds() const;

 private:
  void print(uint64_t disk_done, uint64_t text_bytes, uint64_t tokens, bool last);

  using Clock = std::chrono::steady_clock;
  uint64_t disk_total_;
  bool tty_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_print_ = start_;
  bool printed_ = false;
};

}  // namespace pt
