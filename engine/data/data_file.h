// A data file a run reads from start to end: opened once, its size and
// modification time recorded, and re-checked (fstat of the open descriptor)
// before every batch, so a file truncated, extended or rewritten under the
// run stops it with a config error naming the file instead of a SIGBUS (a
// read past the end of a shrunk mmap) or silently different samples. Reads
// go through pread, never a mapping: a file that shrinks between the check
// and the read gives a short read, the same error, never a signal.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace dtrain::engine::data {

class DataFile {
 public:
  // Throws dtrain::Error(config) naming data.path, with `open_hint` as the
  // fix, when it cannot be opened; a FIFO or directory is refused, never waited on.
  DataFile(std::string path, const std::string& open_hint);
  ~DataFile();
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Throws dtrain::Error(config) when the size or modification time differs
  // from what open saw: both, before and now.
  void check() const;
  // Reads `n` bytes at `offset` (within the size at open) into `out`.
  // Throws as check() does when the file is shorter now.
  void read(int64_t offset, size_t n, void* out) const;

 private:
  [[noreturn]] void changed(const std::string& why) const;

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  int64_t mtime_ns_ = 0;  // st_mtim, nanoseconds since the epoch
};

}  // namespace dtrain::engine::data
