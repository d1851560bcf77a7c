// ParamOffload (param_offload.h). The store (param_store.h) does the bytes'
// reads and writes. One I/O thread runs the queue in order, so a
// shard's read queued after its write reads what was written. Every buffer
// comes from the shards' own (CPU) allocator, so the counting allocator sees
// what this keeps in memory; a read's buffer becomes the shard's storage
// without a copy, and a written one is freed by the I/O thread after its write.
// Under a GPU (c10's generic stream and event API: no CUDA header, so this
// builds without one) the device copies run on one copy stream from the
// pool, ordered by events alone, never by waiting on the device:
//   - up: the copy stream waits for the caller's stream (the device buffer
//     it fills was allocated there), copies, records the unit's `ready`;
//     page_in makes the caller's stream wait on `ready`;
//   - down: the copy stream waits for the caller's stream (the kernels that
//     changed the shard), copies into the pinned store (host) or a pinned
//     staging buffer whose event the I/O thread synchronizes before its
//     file write (nvme); the device bytes are freed with the copy stream
//     recorded on them, so the allocator reuses them only after the copy;
//   - one copy stream, in order: a shard's copy up after its copy down
//     reads what was copied down.
#include "engine/parallel/zero/param_offload.h"

#include <ATen/ops/empty.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <malloc.h>

#include <chrono>

#include "common/error.h"

namespace dtrain::engine::parallel::zero {
namespace {

int64_t shard_bytes(const at::Tensor& t) { return 4 * t.numel(); }

c10::StorageImpl* storage_of(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

at::Tensor pinned_floats(int64_t n) {
  return at::empty({n}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
}

}  // namespace

struct ParamOffload::Gpu {
  explicit Gpu(c10::Device d)
      : device(d), impl(d.type()), copy(impl.getStreamFromGlobalPool(d, false)), caller_at(d.type()) {}
  c10::Stream caller() const { return impl.getStream(device); }
  // The copy stream waits for everything the caller's stream queued so far.
  void follow_caller() {
    caller_at.record(caller());
    caller_at.block(copy);
  }
  c10::Device device;
  c10::impl::VirtualGuardImpl impl;
  c10::Stream copy;
  c10::Event caller_at;
};

ParamOffload::ParamOffload(std::vector<at::Tensor> shards, ParamOffloadOptions options) : opt_(std::move(options)) {
  for (at::Tensor& t : shards) {
    if (t.device() != shards.front().device() || t.scalar_type() != at::kFloat || !t.is_contiguous() ||
        t.storage_offset() != 0 || int64_t(t.storage().nbytes()) != shard_bytes(t))
      throw Error(ErrorCode::internal,
                  "ParamOffload: a shard is not a contiguous fp32 tensor owning its storage on the shards' device");
    units_.push_back({t, total_, Where::memory, false, {}, {}, {}});
    total_ += t.numel();
    resident_ += shard_bytes(t);
  }
  if (!units_.empty()) allocator_ = units_.front().shard.storage().allocator();
  if (!units_.empty() && !units_.front().shard.device().is_cpu()) {
    gpu_ = std::make_unique<Gpu>(units_.front().shard.device());
    for (Unit& x : units_) x.ready = std::make_unique<c10::Event>(gpu_->device.type());
  }
  if (opt_.host)
    store_ = gpu_ ? make_pinned_host_store(total_) : make_host_store(bytes());
  else
    store_ = make_file_store(opt_.file, bytes());
  for (Unit& x : units_) {
    const at::Tensor host = gpu_ ? x.shard.cpu() : x.shard;  // a GPU's shard: copied once, synchronously
    store_->io(true, 4 * x.offset, static_cast<char*>(host.data_ptr()), shard_bytes(x.shard));
  }
  for (int u = 0; u < units(); ++u) page_out(u);  // clean: freed, nothing queued
  // The shards were heap memory, which the worker keeps for reuse (no
  // trim): give their pages back now, before the optimizer's state and the
  // first step's buffers are laid out around the holes.
  ::malloc_trim(0);
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
  if (gpu_) gpu_->copy.synchronize();  // no copy still reads or writes what is freed next
}

void ParamOffload::grow(int64_t n) {
  resident_ += n;
  peak_ = std::max(peak_, resident_);
}

void ParamOffload::queue_read(int u) {
  Unit& x = units_[size_t(u)];
  const int64_t n = shard_bytes(x.shard);
  x.where = Where::reading;
  if (gpu_) {  // host bytes: the device's are counted when copied up
    queue_.push_back({false, u, {}, pinned_floats(x.shard.numel()), {}});
  } else {
    grow(n);
    queue_.push_back({false, u, allocator_->allocate(size_t(n)), {}, {}});
  }
  cv_.notify_all();
}

void ParamOffload::copy_up(Unit& x, const at::Tensor& src) {
  at::Tensor dst = at::empty({x.shard.numel()}, x.shard.options());  // [S], allocated on the caller's stream
  gpu_->follow_caller();
  {
    c10::StreamGuard on(gpu_->copy);
    dst.copy_(src, /*non_blocking=*/true);  // a pinned source: the allocator keeps it until the copy is done
  }
  x.ready->record(gpu_->copy);
  x.buffer = storage_of(dst)->set_data_ptr(at::DataPtr(nullptr, dst.device()));
  x.staging = at::Tensor();
  x.where = Where::read;
  grow(shard_bytes(x.shard));
}

void ParamOffload::copy_down(int u) {
  Unit& x = units_[size_t(u)];
  gpu_->follow_caller();
  const at::Tensor pinned = store_->pinned();
  at::Tensor dst = pinned.defined() ? pinned.narrow(0, x.offset, x.shard.numel()) : pinned_floats(x.shard.numel());
  {
    c10::StreamGuard on(gpu_->copy);
    dst.copy_(x.shard, /*non_blocking=*/true);
  }
  if (pinned.defined()) return;  // in the store once the copy stream gets there
  auto copied = std::make_shared<c10::Event>(gpu_->device.type());
  copied->record(gpu_->copy);
  queue_.push_back({true, u, {}, std::move(dst), std::move(copied)});
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
    const int64_t t0 = optim::offload_now_ns();
    std::exception_ptr failed;
    const Unit& x = units_[size_t(op.unit)];  // offset and size only: fixed after construction
    const int64_t n = shard_bytes(x.shard);
    char* p = static_cast<char*>(op.staging.defined() ? op.staging.data_ptr() : op.buffer.get());
    try {
      if (op.copied) op.copied->synchronize();  // the device's bytes are in the staging buffer
      // After an error nothing more is read or written.
      if (!error_) store_->io(op.write, 4 * x.offset, p, n);
    } catch (...) {
      failed = std::current_exception();
    }
    if (op.write) op.buffer.clear(), op.staging = at::Tensor();  // written: its bytes leave memory
    lock.lock();
    io_ns_ += optim::offload_now_ns() - t0;
    --busy_;
    if (failed && !error_) error_ = failed;
    if (op.write) {
      if (!gpu_) resident_ -= n;  // a GPU's device bytes left at page_out
    } else {
      Unit& r = units_[size_t(op.unit)];
      r.buffer = std::move(op.buffer);
      r.staging = std::move(op.staging);
      r.where = Where::read;
    }
    cv_.notify_all();
  }
}

// A GPU's host store is copied up at once; a file is read first (its copy
// up then waits for page_in).
void ParamOffload::prefetch(int u) {
  if (u < 0 || u >= units()) return;
  std::lock_guard<std::mutex> lock(mu_);
  Unit& x = units_[size_t(u)];
  if (x.where != Where::file) return;
  const at::Tensor pinned = gpu_ ? store_->pinned() : at::Tensor();
  if (pinned.defined())
    copy_up(x, pinned.narrow(0, x.offset, x.shard.numel()));
  else
    queue_read(u);
}

void ParamOffload::page_in(int u) {
  std::unique_lock<std::mutex> lock(mu_);
  Unit& x = units_[size_t(u)];
  if (x.where == Where::memory) return;
  const at::Tensor pinned = gpu_ ? store_->pinned() : at::Tensor();
  if (x.where == Where::file && pinned.defined()) copy_up(x, pinned.narrow(0, x.offset, x.shard.numel()));
  if (x.where == Where::file) queue_read(u);
  const int64_t t0 = optim::offload_now_ns();
  cv_.wait(lock, [&] { return error_ || x.where == Where::read; });
  wait_ns_ += optim::offload_now_ns() - t0;
  if (error_) std::rethrow_exception(error_);
  if (gpu_ && x.staging.defined()) copy_up(x, x.staging);  // nvme: the file's bytes, now up
  if (gpu_) x.ready->block(gpu_->caller());  // the next kernel (the unit's all-gather) sees them
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
    if (gpu_ && x.buffer) gpu_->impl.recordDataPtrOnStream(x.buffer, gpu_->copy);  // its copy up may still run
    if (!gpu_ || x.buffer) resident_ -= n;
    x.buffer.clear();
    x.staging = at::Tensor();
    x.where = Where::file;
    return;
  }
  if (x.where == Where::file) return;
  const bool write = x.dirty && !opt_.drop_writes;
  x.dirty = false;
  if (gpu_ && write) copy_down(u);  // reads the shard: before its bytes leave it
  c10::StorageImpl* s = storage_of(x.shard);
  at::DataPtr bytes = s->set_data_ptr(at::DataPtr(nullptr, x.shard.device()));
  s->set_nbytes(0);
  x.where = Where::file;
  if (gpu_) {
    if (write) gpu_->impl.recordDataPtrOnStream(bytes, gpu_->copy);
    bytes.clear();
    resident_ -= n;
  } else if (write) {
    queue_.push_back({true, u, std::move(bytes), {}, {}});
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
  const int64_t t0 = optim::offload_now_ns();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ || (queue_.empty() && busy_ == 0); });
  if (gpu_) gpu_->copy.synchronize();  // the host store's copies down, too
  wait_ns_ += optim::offload_now_ns() - t0;
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
