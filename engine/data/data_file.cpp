// DataFile (data_file.h): open + fstat, the per-batch re-check and pread.
// Why not a SIGBUS handler with siglongjmp around reads of the mapping: the
// handler is process-wide (LibTorch, Gloo and CUDA threads share it), jumping
// out of a C++ frame skips destructors, and a fault in another thread cannot
// be tied to this dataset. A pread per sample (seq_len + 1 tokens) and an
// fstat per batch cost microseconds against a step's milliseconds.
#include "engine/data/data_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "common/error.h"

namespace dtrain::engine::data {
namespace {

int64_t mtime_ns(const struct stat& st) { return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

// "2026-12-01T16:10:01.123456789Z"
std::string time_text(int64_t ns) {
  const std::time_t s = std::time_t(ns / 1000000000);
  std::tm tm{};
  ::gmtime_r(&s, &tm);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%09lldZ", static_cast<long long>(ns % 1000000000));
  return buf;
}

}  // namespace

DataFile::DataFile(std::string path, const std::string& open_hint) : path_(std::move(path)) {
  // O_NONBLOCK: a FIFO given as data.path is refused below instead of
  // blocking the open (it means nothing for a regular file).
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0)
    throw Error(ErrorCode::config, "data.path = '" + path_ + "': cannot open (" + std::strerror(errno) + ")",
                open_hint);
  struct stat st {};
  std::string problem;
  if (::fstat(fd_, &st) != 0) problem = std::string("cannot stat (") + std::strerror(errno) + ")";
  else if (!S_ISREG(st.st_mode)) problem = "is not a regular file";
  if (!problem.empty()) {
    ::close(fd_);
    fd_ = -1;
    throw Error(ErrorCode::config, "data.path = '" + path_ + "': " + problem, "point data.path at a regular file");
  }
  size_ = int64_t(st.st_size);
  mtime_ns_ = mtime_ns(st);
}

DataFile::~DataFile() {
  if (fd_ >= 0) ::close(fd_);
}

void DataFile::changed(const std::string& why) const {
  throw Error(ErrorCode::config, "data.path = '" + path_ + "' changed while training: " + why,
              "a run reads its data file until the end: put the original file back and resume "
              "(dtrain resume --ckpt <checkpoint.dir>), or train on the new file from the start "
              "(dtrain launch SPEC --fresh); write new data to a new file, never over one in use");
}

void DataFile::check() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) changed(std::string("cannot stat it (") + std::strerror(errno) + ")");
  const int64_t size = int64_t(st.st_size), mtime = mtime_ns(st);
  if (size == size_ && mtime == mtime_ns_) return;
  changed("size " + std::to_string(size_) + " -> " + std::to_string(size) + " bytes, modified " +
          time_text(mtime_ns_) + " -> " + time_text(mtime) + " (at open -> now)");
}

void DataFile::read(int64_t offset, size_t n, void* out) const {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, p, n, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const std::string why = got < 0 ? std::strerror(errno) : "end of file";
      check();  // shrunk or rewritten: names both sizes
      changed("reading " + std::to_string(n) + " bytes at offset " + std::to_string(offset) + " failed (" + why + ")");
    }
    p += got;
    offset += got;
    n -= size_t(got);
  }
}

}  // namespace dtrain::engine::data
