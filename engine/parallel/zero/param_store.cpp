// make_file_store and make_host_store (param_store.h). The file store uses
// the optimizer's offload I/O (optim/offload_store.h): a truncated or deleted
// file is an error that names it, never a SIGBUS. The pinned store is one
// page-locked tensor, so the GPU's copies to and from it are asynchronous.
#include "engine/parallel/zero/param_store.h"

#include <ATen/ops/empty.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "engine/optim/offload_store.h"

namespace dtrain::engine::parallel::zero {
namespace {

class FileStore final : public ParamStore {
 public:
  FileStore(std::string file, int64_t bytes) : file_(std::move(file)), bytes_(bytes) {
    // O_TRUNC: a file an earlier, killed launch left is rewritten from this run's shards.
    fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0)
      throw Error(ErrorCode::config, "train.offload.path: cannot create " + file_ + ": " + std::strerror(errno),
                  "point train.offload.path at a writable directory");
    if (::ftruncate(fd_, bytes_) != 0) {
      const int err = errno;
      close_and_remove();
      throw Error(ErrorCode::config, "train.offload.path: cannot size " + file_ + " to " + std::to_string(bytes_) +
                                         " bytes: " + std::strerror(err),
                  "free space under train.offload.path");
    }
  }
  ~FileStore() override { close_and_remove(); }  // the job's scratch: nothing stays under train.offload.path

  void io(bool write, int64_t offset, char* p, int64_t n) override {
    // Before every read and write: a write past a truncated end would grow
    // the file again, and the rest would read back as zeros.
    check();
    optim::offload_file_io(fd_, file_, write, offset, p, n);
  }
  void check() const override { optim::check_offload_file(fd_, file_, bytes_); }
  const std::string& file() const override { return file_; }
  std::string where() const override { return file_; }

 private:
  void close_and_remove() {
    if (fd_ < 0) return;
    ::close(fd_);
    ::unlink(file_.c_str());
    fd_ = -1;
  }
  std::string file_;
  int64_t bytes_;
  int fd_ = -1;
};

class HostStore final : public ParamStore {
 public:
  explicit HostStore(int64_t bytes) : bytes_(new char[size_t(std::max<int64_t>(1, bytes))]) {}
  void io(bool write, int64_t offset, char* p, int64_t n) override {
    if (write)
      std::memcpy(bytes_.get() + offset, p, size_t(n));
    else
      std::memcpy(p, bytes_.get() + offset, size_t(n));
  }
  void check() const override {}
  const std::string& file() const override { return none_; }
  std::string where() const override { return "host memory"; }

 private:
  std::unique_ptr<char[]> bytes_;
  std::string none_;
};

class PinnedHostStore final : public ParamStore {
 public:
  explicit PinnedHostStore(int64_t elements)
      : bytes_(at::empty({std::max<int64_t>(1, elements)}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true))) {}
  void io(bool write, int64_t offset, char* p, int64_t n) override {
    char* base = static_cast<char*>(bytes_.data_ptr());
    if (write)
      std::memcpy(base + offset, p, size_t(n));
    else
      std::memcpy(p, base + offset, size_t(n));
  }
  void check() const override {}
  const std::string& file() const override { return none_; }
  std::string where() const override { return "pinned host memory"; }
  at::Tensor pinned() const override { return bytes_; }

 private:
  at::Tensor bytes_;  // [elements], page-locked
  std::string none_;
};

}  // namespace

std::unique_ptr<ParamStore> make_file_store(const std::string& file, int64_t bytes) {
  return std::make_unique<FileStore>(file, bytes);
}

std::unique_ptr<ParamStore> make_host_store(int64_t bytes) { return std::make_unique<HostStore>(bytes); }

std::unique_ptr<ParamStore> make_pinned_host_store(int64_t elements) {
  return std::make_unique<PinnedHostStore>(elements);
}

}  // namespace dtrain::engine::parallel::zero
