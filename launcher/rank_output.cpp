// RankOutput and tail_lines (see rank_output.h). Console lines are written
// with one write(2) each, so lines of different ranks do not interleave.
#include "launcher/rank_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>

#include "common/error.h"

namespace dtrain::launcher {

namespace {

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // console or disk gone: the worker must not stall on it
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

RankOutput::RankOutput(int rank, const std::string& log_path, bool console,
                       const std::string& header)
    : prefix_("[rank " + std::to_string(rank) + "] "), console_(console) {
  log_fd_ = ::open(log_path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (log_fd_ < 0)
    throw Error(ErrorCode::config,
                "cannot open worker log " + log_path + ": " + std::strerror(errno),
                errno == ELOOP ? "it is a symbolic link: remove it (dtrain never writes through links)"
                               : "check that log.dir is writable");
  // Start on a fresh line if the last run ended mid-line.
  off_t size = ::lseek(log_fd_, 0, SEEK_END);
  char last = '\n';
  if (size > 0 && ::pread(log_fd_, &last, 1, size - 1) == 1 && last != '\n')
    write_all(log_fd_, "\n", 1);
  if (!header.empty()) {
    const std::string line = header + "\n";
    write_all(log_fd_, line.data(), line.size());
  }
}

RankOutput::~RankOutput() {
  flush();
  if (log_fd_ >= 0) ::close(log_fd_);
}

void RankOutput::write(const char* data, size_t size) {
  write_all(log_fd_, data, size);
  if (!console_) return;
  size_t start = 0;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] != '\n') continue;
    if (!partial_.empty()) {
      partial_.append(data + start, i - start);
      console_line(partial_.data(), partial_.size());
      partial_.clear();
    } else {
      console_line(data + start, i - start);
    }
    start = i + 1;
  }
  partial_.append(data + start, size - start);
}

void RankOutput::flush() {
  if (!console_ || partial_.empty()) return;
  console_line(partial_.data(), partial_.size());
  partial_.clear();
}

void RankOutput::console_line(const char* data, size_t size) {
  std::string line;
  line.reserve(prefix_.size() + size + 1);
  line.append(prefix_).append(data, size).push_back('\n');
  write_all(STDOUT_FILENO, line.data(), line.size());
}

std::vector<std::string> tail_lines(const std::string& path, size_t count) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (lines.size() > count) lines.pop_front();
  }
  return {lines.begin(), lines.end()};
}

}  // namespace dtrain::launcher
