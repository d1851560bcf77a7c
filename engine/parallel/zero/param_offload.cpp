// ParamOffload (param_offload.h). The store (param_store.h) does the bytes'
// reads and writes. One I/O thread runs the queue in order, so a
// shard's read queued after its write reads what was written. Every buffer
// comes from the shards' own (CPU) allocator, so the counting allocator sees
// what this keeps in memory; a read's buffer becomes the shard's storage
// without a copy, and a written one is freed by the I/O thread after its write.
#include "engine/parallel/zero/param_offload.h"

#include <c10/core/StorageImpl.h>

#include <chrono>

#include "common/error.h"

namespace dtrain::engine::parallel::zero {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t shard_bytes(const at::Tensor& t) { return 4 * t.numel(); }

c10::StorageImpl* storage_of(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

}  // namespace

ParamOffload::ParamOffload(std::vector<at::Tensor> shards, ParamOffloadOptions options) : opt_(std::move(options)) {
  for (at::Tensor& t : shards) {
    if (!t.device().is_cpu() || t.scalar_type() != at::kFloat || !t.is_contiguous() || t.storage_offset() != 0 ||
        int64_t(t.storage().nbytes()) != shard_bytes(t))
      throw Error(ErrorCode::internal, "ParamOffload: a shard is not a contiguous fp32 CPU tensor owning its storage");
    units_.push_back({t, total_, Where::memory, false, {}});
    total_ += t.numel();
    resident_ += shard_bytes(t);
  }
  if (!units_.empty()) allocator_ = units_.front().shard.storage().allocator();
  store_ = opt_.host ? make_host_store(bytes()) : make_file_store(opt_.file, bytes());
  for (Unit& x : units_) store_->io(true, 4 * x.offset, static_cast<char*>(x.shard.data_ptr()), shard_bytes(x.shard));
  for (int u = 0; u < units(); ++u) page_out(u);  // clean: freed, nothing queued
  peak_ = resident_;
  thread_ = std::thread([this] { run_io(); });
}

ParamOffload::~ParamOffload() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

void ParamOffload::grow(int64_t n) {
  resident_ += n;
  peak_ = std::max(peak_, resident_);
}

void ParamOffload::queue_read(int u) {
  Unit& x = units_[size_t(u)];
  const int64_t n = shard_bytes(x.shard);
  x.where = Where::reading;
  grow(n);
  queue_.push_back({false, u, allocator_->allocate(size_t(n))});
  cv_.notify_all();
}

void ParamOffload::run_io() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, nothing left
    Op op = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    lock.unlock();
    const int64_t t0 = now_ns();
    std::exception_ptr failed;
    const Unit& x = units_[size_t(op.unit)];  // offset and size only: fixed after construction
    const int64_t n = shard_bytes(x.shard);
    try {
      // After an error nothing more is read or written.
      if (!error_) store_->io(op.write, 4 * x.offset, static_cast<char*>(op.buffer.get()), n);
    } catch (...) {
      failed = std::current_exception();
    }
    if (op.write) op.buffer.clear();  // written: its bytes leave memory
    lock.lock();
    io_ns_ += now_ns() - t0;
    --busy_;
    if (failed && !error_) error_ = failed;
    if (op.write) {
      resident_ -= n;
    } else {
      Unit& r = units_[size_t(op.unit)];
      r.buffer = std::move(op.buffer);
      r.where = Where::read;
    }
    cv_.notify_all();
  }
}

void ParamOffload::prefetch(int u) {
  if (u < 0 || u >= units()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (units_[size_t(u)].where == Where::file) queue_read(u);
}

void ParamOffload::page_in(int u) {
  std::unique_lock<std::mutex> lock(mu_);
  Unit& x = units_[size_t(u)];
  if (x.where == Where::memory) return;
  if (x.where == Where::file) queue_read(u);
  const int64_t t0 = now_ns();
  cv_.wait(lock, [&] { return error_ || x.where == Where::read; });
  wait_ns_ += now_ns() - t0;
  if (error_) std::rethrow_exception(error_);
  c10::StorageImpl* s = storage_of(x.shard);
  s->set_data_ptr_noswap(std::move(x.buffer));
  s->set_nbytes(size_t(shard_bytes(x.shard)));
  x.where = Where::memory;
  x.dirty = false;
}

void ParamOffload::page_out(int u) {
  std::unique_lock<std::mutex> lock(mu_);
  Unit& x = units_[size_t(u)];
  const int64_t n = shard_bytes(x.shard);
  if (x.where == Where::reading) {  // its buffer is the I/O thread's until the read is done
    cv_.wait(lock, [&] { return error_ || x.where == Where::read; });
    if (error_) std::rethrow_exception(error_);
  }
  if (x.where == Where::read) {
    x.buffer.clear();
    resident_ -= n;
    x.where = Where::file;
    return;
  }
  if (x.where == Where::file) return;
  c10::StorageImpl* s = storage_of(x.shard);
  at::DataPtr bytes = s->set_data_ptr(at::DataPtr(nullptr, x.shard.device()));
  s->set_nbytes(0);
  x.where = Where::file;
  const bool write = x.dirty && !opt_.drop_writes;
  x.dirty = false;
  if (write) {
    queue_.push_back({true, u, std::move(bytes)});
    cv_.notify_all();
  } else {
    bytes.clear();
    resident_ -= n;
  }
}

void ParamOffload::mark_dirty(int u) {
  std::lock_guard<std::mutex> lock(mu_);
  Unit& x = units_[size_t(u)];
  if (x.where != Where::memory)
    throw Error(ErrorCode::internal, "ParamOffload: unit " + std::to_string(u) + " changed while not in memory");
  x.dirty = true;
}

void ParamOffload::page_in_all(bool dirty) {
  for (int u = 0; u < units(); ++u) prefetch(u);
  for (int u = 0; u < units(); ++u) {
    page_in(u);
    if (dirty) mark_dirty(u);
  }
}

void ParamOffload::drain() {
  const int64_t t0 = now_ns();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ || (queue_.empty() && busy_ == 0); });
  wait_ns_ += now_ns() - t0;
  if (error_) std::rethrow_exception(error_);
}

int64_t ParamOffload::resident_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resident_;
}

int64_t ParamOffload::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void ParamOffload::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = resident_;
}

optim::OffloadIo ParamOffload::take_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  optim::OffloadIo out{double(io_ns_) * 1e-9, double(wait_ns_) * 1e-9};
  io_ns_ = wait_ns_ = 0;
  return out;
}

}  // namespace dtrain::engine::parallel::zero
