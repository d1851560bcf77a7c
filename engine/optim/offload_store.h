// Where an offloaded AdamW keeps its moments: one file per rank read and
// written with pread/pwrite in buckets by two I/O threads, one reading and
// one writing, through three staging slots (nvme), or one host
// buffer, pinned under a GPU (host). The elements of every parameter, in
// order, are cut into buckets; bucket b's m then v lie together (file offset
// 8 * its first element). Owns the file (created at start, removed at the
// end) and its checks; not the update (adamw.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::engine::optim {

struct OffloadOptions {
  bool nvme = true;         // false: host memory
  bool pinned = false;      // host: page-locked (a GPU copies from it)
  std::string file;         // nvme: the rank's file, replaced if it exists
  int64_t bucket_floats = 8 << 20;  // elements of one moment per bucket
  bool drop_writes = false;  // fault.kind offload_no_writeback: release() writes nothing
  int threads = 1;           // host: threads that run the update (HostUpdate)
};

// Since the last take_stats: seconds of transfer (nvme: the I/O thread's
// pread and pwrite; host: the training thread copying gradients down and the
// master up, synchronous on a CPU, the copies' launches under a GPU), seconds
// the training thread waited for transfers, and seconds of AdamW's update on
// the offloaded state (AdamW fills update_s; the store leaves it 0).
// The steady clock in nanoseconds: every offload counter's timer.
inline int64_t offload_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct OffloadIo {
  double io_s = 0;
  double wait_s = 0;
  double update_s = 0;
};

// An offload file as the trainer sees it, whatever keeps it (ZeRO-3's
// parameter shards: parallel/zero/param_offload.h): its size, its I/O since
// the last take_stats, and its path (for the fault kinds that damage it).
class OffloadFile {
 public:
  virtual ~OffloadFile() = default;
  virtual void drain() = 0;  // every queued read and write done
  virtual const std::string& file() const = 0;
  virtual int64_t bytes() const = 0;
  virtual OffloadIo take_stats() = 0;
};

// The pread/pwrite of n bytes at `offset` of `file` (open as fd), retried
// until done; a short read or a failed call throws, naming the file.
void offload_file_io(int fd, const std::string& file, bool write, int64_t offset, char* p, int64_t n);
// Throws when `file` (open as fd) was deleted, or truncated below `bytes`.
void check_offload_file(int fd, const std::string& file, int64_t bytes);

class OffloadStore {
 public:
  // sizes: the element count of each parameter, in the optimizer's order.
  OffloadStore(const std::vector<int64_t>& sizes, OffloadOptions options);
  ~OffloadStore();  // drains the queue, closes and removes the file
  OffloadStore(const OffloadStore&) = delete;
  OffloadStore& operator=(const OffloadStore&) = delete;

  // A contiguous run of one parameter's elements inside a bucket.
  struct Piece {
    size_t param;
    int64_t begin, end;  // elements of the parameter
    int64_t at;          // its first element's place in the bucket
  };
  int buckets() const { return int(buckets_.size()); }
  const std::vector<Piece>& pieces(int b) const { return buckets_[b].pieces; }
  int64_t bucket_len(int b) const { return buckets_[b].len; }

  // The bucket's m (len floats) followed by its v, once read. Blocks.
  float* acquire(int b);
  // Done with b: nvme queues its write (the slot is reused after it).
  void release(int b);
  // Queues b's read unless its slot already holds or awaits it; the read
  // starts once the slot's last bucket is written.
  void prefetch(int b);
  // Buckets in memory at once: b is in slot b % slots(), so b + slots() may
  // be queued once b is released.
  static constexpr int slots() { return kSlots; }
  // Every queued read and write done; rethrows the I/O thread's error.
  void drain();
  // Synchronous whole-bucket copies (checkpoint save/load), after drain():
  // into / from `mv` (2 * bucket_len floats). Forget what the slots hold.
  void read_bucket(int b, float* mv);
  void write_bucket(int b, const float* mv);
  // Throws when the file was deleted or truncated under the job.
  void check_file() const;

  int64_t bytes() const { return 8 * total_; }      // where the state lives: host or nvme
  int64_t staging_bytes() const;                     // nvme: the slots' bytes in memory
  bool nvme() const { return opt_.nvme; }
  const std::string& file() const { return opt_.file; }
  OffloadIo take_stats();

 private:
  struct Bucket {
    int64_t first = 0, len = 0;  // elements, in the order of all parameters
    std::vector<Piece> pieces;
  };
  // Three: while the training thread updates b, the reader fills b + 1 and
  // the writer empties b - 1, so a step's update phase takes the longest of
  // the three per bucket instead of a read plus a write.
  static constexpr int kSlots = 3;
  struct Slot {
    at::Tensor buffer;  // 2 * bucket_floats floats (counted by the CPU allocator)
    int bucket = -1;    // which bucket it holds or awaits; -1 none
    bool ready = false;
    bool writing = false;  // its last bucket's write is queued or running
  };
  struct Op {
    bool write;
    int bucket, slot;
  };
  void run_io(bool write);
  void do_io(const Op& op);

  OffloadOptions opt_;
  int64_t total_ = 0;
  std::vector<Bucket> buckets_;
  at::Tensor host_;  // host: every bucket, as in the file
  int fd_ = -1;
  Slot slots_[kSlots];
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> reads_, writes_;  // each in order
  int busy_ = 0;  // ops taken by a thread, not done
  bool stop_ = false;
  std::exception_ptr error_;
  int64_t io_ns_ = 0, wait_ns_ = 0;
  std::thread reader_, writer_;
};

}  // namespace dtrain::engine::optim
