// Where ZeRO-3's parameter shards live between uses under
// train.offload.params: a store per rank (param_store.h: a file under nvme,
// a host buffer under host), unit u's shard (the fp32 master the optimizer
// updates) at its place in it, read back by an I/O thread before the unit's
// all-gather and written back after its update.
// A shard away in its store is a tensor whose storage holds zero bytes; reading
// it back gives that storage its bytes again, so every view of it (the
// optimizer's pieces, the checkpoint's slices) sees the values. Owns the
// store (a file is created at start, removed at the end) and its buffers; not when to
// read or write (zero_sync.cpp decides).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Event.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/optim/offload_store.h"
#include "engine/parallel/zero/param_store.h"

namespace dtrain::engine::parallel::zero {

struct ParamOffloadOptions {
  std::string file;          // nvme: the rank's file, replaced if it exists
  bool host = false;         // host: the shards in a host buffer instead (file unused)
  bool drop_writes = false;  // fault.kind offload_no_writeback: updated shards are never written back
};

class ParamOffload final : public optim::OffloadFile {
 public:
  // shards: each unit's shard, fp32, contiguous, all on the CPU or all on
  // one GPU, each with a storage of its own. Writes their values to the
  // store and frees them.
  ParamOffload(std::vector<at::Tensor> shards, ParamOffloadOptions options);
  ~ParamOffload() override;  // drains the queue; a file store is closed and removed
  ParamOffload(const ParamOffload&) = delete;
  ParamOffload& operator=(const ParamOffload&) = delete;

  int units() const { return int(units_.size()); }
  // Shard u in memory (read from the store unless it is there). Blocks.
  void page_in(int u);
  // Queues shard u's read unless it is in memory or on its way; u out of
  // range: nothing.
  void prefetch(int u);
  // Done with shard u: its bytes leave memory, queued for writing first
  // when they changed since they were read (mark_dirty).
  void page_out(int u);
  void mark_dirty(int u);
  // Every shard in memory (a checkpoint reads or writes them); dirty: a
  // load will change them.
  void page_in_all(bool dirty);
  // Every queued read and write done; rethrows the I/O thread's error.
  void drain() override;
  // Throws when the file was deleted or truncated under the job.
  void check_file() const { store_->check(); }

  int64_t bytes() const override { return 4 * total_; }  // the store's size
  // Shard bytes in memory (in use, read ahead, or waiting to be written):
  // now, and the most since the last reset_peak.
  int64_t resident_bytes() const;
  int64_t peak_bytes() const;
  void reset_peak();
  const std::string& file() const override { return store_->file(); }  // "" under host
  std::string where() const { return store_->where(); }
  optim::OffloadIo take_stats() override;

 private:
  enum class Where { file, reading, read, memory };
  struct Unit {
    at::Tensor shard;     // [S]: its storage holds 4 * S bytes when in memory, else none
    int64_t offset = 0;   // its first element in the store
    Where where = Where::memory;
    bool dirty = false;
    // Where::read: the bytes read, not yet the shard's (on a GPU: device
    // bytes whose copy from the host `ready` marks done).
    at::DataPtr buffer;
    at::Tensor staging;   // GPU, nvme: [S] pinned, the file's bytes before their copy up
    std::unique_ptr<c10::Event> ready;  // GPU: `buffer`'s copy to the device
  };
  struct Op {
    bool write;
    int unit;
    at::DataPtr buffer;  // read into, or written from (freed after)
    at::Tensor staging;  // GPU: the pinned bytes instead of `buffer`
    std::shared_ptr<c10::Event> copied;  // GPU write: the copy down into `staging`
  };
  struct Gpu;  // the copy stream and the caller's (none on a CPU)
  void run_io();
  void queue_read(int u);  // under mu_
  void grow(int64_t n);    // under mu_: resident_ += n, the peak follows
  // Under mu_, GPU only: shard u's bytes up from `src` (pinned, [S]) into
  // a device buffer on the copy stream; Where::read.
  void copy_up(Unit& x, const at::Tensor& src);
  // Under mu_, GPU only: the shard's changed bytes down to its store.
  void copy_down(int u);

  ParamOffloadOptions opt_;
  std::vector<Unit> units_;
  int64_t total_ = 0;  // elements
  c10::Allocator* allocator_ = nullptr;
  std::unique_ptr<ParamStore> store_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  int busy_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  int64_t resident_ = 0, peak_ = 0;
  int64_t io_ns_ = 0, wait_ns_ = 0;
  std::unique_ptr<Gpu> gpu_;
  std::thread thread_;
};

}  // namespace dtrain::engine::parallel::zero
