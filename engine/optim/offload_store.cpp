// OffloadStore (offload_store.h). pread/pwrite rather than a mapping: a file
// truncated under a mapping raises SIGBUS at the next touch, with no way to
// say which file; a short read is an error we can name. A reader and a
// writer thread each run their queue in order; a read into a slot waits
// until the slot's queued write is done (bucket b uses slot b % kSlots).
#include "engine/optim/offload_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/log.h"

namespace dtrain::engine::optim {

OffloadStore::OffloadStore(const std::vector<int64_t>& sizes, OffloadOptions options) : opt_(std::move(options)) {
  // Buckets: parameters in order, cut every bucket_floats elements.
  const int64_t cap = std::max<int64_t>(1, opt_.bucket_floats);
  for (size_t i = 0; i < sizes.size(); ++i)
    for (int64_t begin = 0; begin < sizes[i];) {
      if (buckets_.empty() || buckets_.back().len == cap) buckets_.push_back({total_, 0, {}});
      Bucket& b = buckets_.back();
      const int64_t n = std::min(sizes[i] - begin, cap - b.len);
      b.pieces.push_back({i, begin, begin + n, b.len});
      b.len += n;
      begin += n;
      total_ += n;
    }
  if (!opt_.nvme) {
    host_ = at::zeros({2 * total_}, at::TensorOptions().dtype(at::kFloat).pinned_memory(opt_.pinned));
    return;
  }
  // O_TRUNC: a file of an earlier launch of this job (killed before it could
  // remove it) starts again from zeros, as a fresh AdamW's moments.
  fd_ = ::open(opt_.file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0)
    throw Error(ErrorCode::config, "train.offload.path: cannot create " + opt_.file + ": " + std::strerror(errno),
                "point train.offload.path at a writable directory");
  if (::ftruncate(fd_, 8 * total_) != 0) {
    const int e = errno;
    ::close(fd_);
    ::unlink(opt_.file.c_str());
    throw Error(ErrorCode::config, "train.offload.path: cannot size " + opt_.file + " to " +
                                       std::to_string(8 * total_) + " bytes: " + std::strerror(e),
                "free space under train.offload.path");
  }
  const int64_t slot = 2 * std::min(cap, total_);
  for (Slot& s : slots_) s.buffer = at::empty({std::max<int64_t>(1, slot)}, at::TensorOptions().dtype(at::kFloat));
  reader_ = std::thread([this] { run_io(false); });
  writer_ = std::thread([this] { run_io(true); });
}

OffloadStore::~OffloadStore() {
  if (reader_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    reader_.join();
    writer_.join();
  }
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(opt_.file.c_str());  // the job's scratch: nothing stays under train.offload.path
  }
}

int64_t OffloadStore::staging_bytes() const {
  int64_t n = 0;
  for (const Slot& s : slots_)
    if (s.buffer.defined()) n += s.buffer.numel() * 4;
  return n;
}

void check_offload_file(int fd, const std::string& file, int64_t bytes) {
  if (fd < 0) return;
  struct stat st {};
  const std::string fix = "leave train.offload.path alone while the job runs; resume from the last checkpoint";
  if (::fstat(fd, &st) != 0 || st.st_nlink == 0)
    throw Error(ErrorCode::config, "offload file " + file + " was deleted while the job ran", fix);
  if (st.st_size < bytes)
    throw Error(ErrorCode::config, "offload file " + file + " was truncated while the job ran: " +
                                       std::to_string(st.st_size) + " bytes, " + std::to_string(bytes) +
                                       " expected",
                fix);
}

void offload_file_io(int fd, const std::string& file, bool write, int64_t offset, char* p, int64_t n) {
  while (n > 0) {
    const ssize_t got = write ? ::pwrite(fd, p, size_t(n), off_t(offset)) : ::pread(fd, p, size_t(n), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw Error(ErrorCode::config,
                  "offload file " + file + ": " + (write ? "write" : "read") + " at byte " +
                      std::to_string(offset) + " failed: " +
                      (got == 0 ? std::string("end of file (was it truncated?)") : std::strerror(errno)),
                  "leave train.offload.path alone while the job runs, with room for its files; resume from the "
                  "last checkpoint");
    p += got;
    offset += got;
    n -= got;
  }
}

void OffloadStore::check_file() const { check_offload_file(fd_, opt_.file, 8 * total_); }

void OffloadStore::do_io(const Op& op) {
  // Before every read and write: a write past a truncated end would grow the
  // file again, and the rest would read back as zeros.
  check_file();
  const Bucket& b = buckets_[op.bucket];
  offload_file_io(fd_, opt_.file, op.write, 8 * b.first, reinterpret_cast<char*>(slots_[op.slot].buffer.data_ptr<float>()), 8 * b.len);
}

// Each thread leaves only when stop_ is set and its queue is empty: a read
// waiting for its slot's write still runs once the writer is done.
void OffloadStore::run_io(bool write) {
  std::deque<Op>& queue = write ? writes_ : reads_;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] {
      return (stop_ && queue.empty()) || (!queue.empty() && (write || !slots_[queue.front().slot].writing));
    });
    if (queue.empty()) return;  // stop_, nothing left
    const Op op = queue.front();
    queue.pop_front();
    ++busy_;
    lock.unlock();
    const int64_t t0 = offload_now_ns();
    std::exception_ptr failed;
    try {
      if (!error_) do_io(op);  // after an error nothing more is read or written
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    io_ns_ += offload_now_ns() - t0;
    --busy_;
    if (failed && !error_) error_ = failed;
    if (op.write) slots_[op.slot].writing = false;
    else if (slots_[op.slot].bucket == op.bucket) slots_[op.slot].ready = true;
    cv_.notify_all();
  }
}

void OffloadStore::prefetch(int b) {
  if (!opt_.nvme) return;
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[b % kSlots];
  if (s.bucket == b) return;
  s.bucket = b;
  s.ready = false;
  reads_.push_back({false, b, b % kSlots});
  cv_.notify_all();
}

float* OffloadStore::acquire(int b) {
  if (!opt_.nvme) return host_.data_ptr<float>() + 2 * buckets_[b].first;
  prefetch(b);
  const int64_t t0 = offload_now_ns();
  std::unique_lock<std::mutex> lock(mu_);
  Slot& s = slots_[b % kSlots];
  cv_.wait(lock, [&] { return error_ || s.ready; });
  wait_ns_ += offload_now_ns() - t0;
  if (error_) std::rethrow_exception(error_);
  return s.buffer.data_ptr<float>();
}

void OffloadStore::release(int b) {
  if (!opt_.nvme) return;
  std::lock_guard<std::mutex> lock(mu_);
  // The slot's next bucket is read after this write (run_io waits for it).
  Slot& s = slots_[b % kSlots];
  s.bucket = -1;
  s.ready = false;
  if (!opt_.drop_writes) {
    s.writing = true;
    writes_.push_back({true, b, b % kSlots});
  }
  cv_.notify_all();
}

void OffloadStore::drain() {
  if (!opt_.nvme) return;
  const int64_t t0 = offload_now_ns();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return reads_.empty() && writes_.empty() && busy_ == 0; });
  wait_ns_ += offload_now_ns() - t0;
  if (error_) std::rethrow_exception(error_);
}

void OffloadStore::read_bucket(int b, float* mv) {
  const Bucket& k = buckets_[b];
  if (!opt_.nvme) {
    std::memcpy(mv, host_.data_ptr<float>() + 2 * k.first, size_t(8 * k.len));
    return;
  }
  check_file();
  offload_file_io(fd_, opt_.file, false, 8 * k.first, reinterpret_cast<char*>(mv), 8 * k.len);
}

void OffloadStore::write_bucket(int b, const float* mv) {
  const Bucket& k = buckets_[b];
  if (!opt_.nvme) {
    std::memcpy(host_.data_ptr<float>() + 2 * k.first, mv, size_t(8 * k.len));
    return;
  }
  check_file();
  offload_file_io(fd_, opt_.file, true, 8 * k.first, reinterpret_cast<char*>(const_cast<float*>(mv)), 8 * k.len);
  std::lock_guard<std::mutex> lock(mu_);
  for (Slot& s : slots_) s.bucket = -1, s.ready = false;  // what they held may be stale now
}

OffloadIo OffloadStore::take_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  OffloadIo out{double(io_ns_) * 1e-9, double(wait_ns_) * 1e-9};
  io_ns_ = wait_ns_ = 0;
  return out;
}

}  // namespace dtrain::engine::optim
