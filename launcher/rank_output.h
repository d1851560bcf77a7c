// Where one worker's output goes: every byte to its log file
// (<log.dir>/rank_<r>.log), and whole lines to the console with a
// "[rank r] " prefix when that rank is selected (--ranks). Reads no pipes.
// A log is only ever appended to: each run and restart starts with a
// separator line, so an earlier run's output is never lost.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dtrain::launcher {

class RankOutput {
 public:
  // Appends to log_path (created if missing, never through a link), first
  // the line `header` (on a fresh line).
  RankOutput(int rank, const std::string& log_path, bool console, const std::string& header);
  ~RankOutput();
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  void write(const char* data, size_t size);
  // Emit a pending partial line (at the worker's exit).
  void flush();

 private:
  void console_line(const char* data, size_t size);

  std::string prefix_;
  int log_fd_ = -1;
  bool console_;
  std::string partial_;  // console text after the last newline
};

// The last `count` lines of a text file (a worker log), oldest first.
std::vector<std::string> tail_lines(const std::string& path, size_t count);

}  // namespace dtrain::launcher
