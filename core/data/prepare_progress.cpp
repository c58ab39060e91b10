#include "core/data/prepare_progress.h"
#include "core/common/console.h"

#include <unistd.h>

#include <cstdio>

namespace pt {

PrepareProgress::PrepareProgress(uint64_t disk_total) : disk_total_(disk_total), tty_(::isatty(STDERR_FILENO) == 1) {}

double PrepareProgress::seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

void PrepareProgress::update(uint64_t disk_done, uint64_t text_bytes, uint64_t tokens) {
  const auto now = Clock::now();
  if (now - start_ < std::chrono::seconds(1)) return;
  if (now - last_print_ < (tty_ ? std::chrono::milliseconds(500) : std::chrono::milliseconds(10000)) && printed_)
    return;
  print(disk_done, text_bytes, tokens, false);
  last_print_ = now;
  printed_ = true;
}

void PrepareProgress::finish(uint64_t text_bytes, uint64_t tokens) {
  if (printed_) print(disk_total_, text_bytes, tokens, true);
}

void PrepareProgress::print(uint64_t disk_done, uint64_t text_bytes, uint64_t tokens, bool last) {
  const double secs = seconds();
  const double frac = disk_total_ ? static_cast<double>(disk_done) / static_cast<double>(disk_total_) : 1.0;
  const double text_mb = static_cast<double>(text_bytes) / 1e6;
  const double rate = secs > 0 ? text_mb / secs : 0.0;
  char eta[32] = "";
  if (!last && frac > 0.0) {
    const double left = secs * (1.0 - frac) / frac;
    std::snprintf(eta, sizeof(eta), " | ETA %02d:%02d", static_cast<int>(left) / 60, static_cast<int>(left) % 60);
  } else if (last) {
    std::snprintf(eta, sizeof(eta), " | %.1f s", secs);
  }
  print_text(Stream::err, format("%sprepare: %3.0f%% of %.1f MB | %.1f MB text | %.2f M tokens | %.1f MB/s%s%s",
                                 tty_ ? "\r" : "", 100.0 * frac, static_cast<double>(disk_total_) / 1e6, text_mb,
                                 static_cast<double>(tokens) / 1e6, rate, eta, tty_ && !last ? "   " : "\n"));
}

}  // namespace pt
