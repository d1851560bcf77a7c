// Where one worker's output goes: every byte to its log file
// (<log.dir>/rank_<r>.log), and whole lines to the console with a
// "[rank r] " prefix when that rank is selected (--ranks). Reads no pipes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dtrain::launcher {

class RankOutput {
 public:
  // truncate: start a new log (first run); otherwise append (restarts).
  RankOutput(int rank, const std::string& log_path, bool console, bool truncate);
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
