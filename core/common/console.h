// Every line picotrain prints, on stdout or stderr, from any rank or thread, leaves the process
// in one write(2) of the whole line.
//
// Why: under mpirun (or srun) a rank's stdout and stderr are two pipes that the launcher reads
// and forwards separately. A line written in pieces (`std::cerr << "warning: " << msg`, or a
// printf that fills a buffer mid-line) can then reach the log with another line between its
// pieces, and a reader or a log scraper misses it. A single write of at most PIPE_BUF bytes
// reaches a pipe whole, so the launcher reads it whole; longer lines are still written by one
// call and only a reader with a shorter buffer can split them.
//
// The functions bypass stdio's buffers (no FILE lock): the hang watchdog prints from its own
// thread while the stuck thread may hold stdout's lock. So nothing else may write to stdout or
// stderr through stdio while these are used, or the two orders could differ; picotrain's own
// code prints only through here (`picotrain sample` streams its text through stdio and prints
// its info lines here only after flushing).
#pragma once
#include <string>

#include "core/common/format.h"

namespace pt {

enum class Stream { out, err };

// Writes `line` and a '\n' (unless it ends with one) in one write. A text of several lines is
// written whole as well: it stays one block.
void print_line(Stream to, std::string line);
// Writes `text` as it is, in one write: a progress line that a '\r' redraws on a terminal.
void print_text(Stream to, const std::string& text);

// printf-style: print_linef(Stream::out, "step %d", 3).
template <class... A>
void print_linef(Stream to, const char* fmt, A... args) {
  print_line(to, format(fmt, args...));
}

// "warning: <msg>" on stderr, in one write.
void print_warning(const std::string& msg);
// "error: <msg>" on stderr, in one write.
void print_error(const std::string& msg);

}  // namespace pt
