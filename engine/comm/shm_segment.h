// The /dev/shm segments behind the shared-memory collectives: the staging
// segment's layout (a header page of per-set counters, then kSets sets of one
// staging slot per rank plus one result slot), the mapping and the collective
// set-up over the store, and what every protocol on a segment uses: the futex
// wait on a counter and the rank-order reduction. The protocols live in
// shm_group.cpp (staging), shm_symmetric.cpp (symmetric buffers) and
// shm_rings.cpp (point-to-point). Internal to engine/comm.
#pragma once

#include <ATen/core/Tensor.h>
#include <sys/mman.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ctime>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/comm/comm.h"
#include "engine/comm/shm_group.h"

namespace dtrain::engine::comm::detail {

constexpr uint64_t kMagic = 0x3268735f6e696172;  // "rain_sh2"
// Chunks in flight before a set is reused: a rank may run this many chunks
// (kSets x slot_bytes, 4 MiB by default) ahead of the slowest before its
// next launch waits. DDP's buckets of one step fit at the default sizes.
constexpr int kSets = 8;
static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == 4,
              "the futex waits on the atomic's own 4 bytes");

struct alignas(64) Counter {
  std::atomic<uint32_t> value{0};
};

// Per set, for its k-th use (chunk k * kSets + set): staged reaches n (k+1)
// when every rank staged, done becomes k+1 when the result is in, consumed
// reaches n (k+1) when every rank copied it out.
struct SetState {
  Counter staged, done, consumed;
};

struct Header {
  uint64_t magic;
  uint64_t nonce;
  uint64_t slot_bytes;
  uint32_t members;
  SetState sets[kSets];
};

constexpr size_t kDataOffset = 4096;  // the slots start page-aligned
static_assert(sizeof(Header) <= kDataOffset, "header fits its page");

constexpr size_t round_to_page(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }

inline size_t segment_bytes(int members, int64_t slot_bytes) {
  return kDataOffset + size_t{kSets} * (static_cast<size_t>(members) + 1) * static_cast<size_t>(slot_bytes);
}

// A mapped segment; unmapped on destruction (the name is unlinked as soon
// as every member mapped it, so nothing stays in /dev/shm after a crash).
class Segment {
 public:
  Segment(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  ~Segment() { munmap(base_, bytes_); }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  Header& header() const { return *static_cast<Header*>(base_); }
  char* base() const { return static_cast<char*>(base_); }
  // Slot `index` of set `set`: 0..n-1 the ranks' staging slots, n the result.
  char* slot(int set, int index) const {
    const auto& h = header();
    return static_cast<char*>(base_) + kDataOffset +
           (static_cast<size_t>(set) * (h.members + 1) + static_cast<size_t>(index)) * h.slot_bytes;
  }

 private:
  void* base_;
  size_t bytes_;
};

// Rank 0 of g creates the segment and publishes its name and a nonce under
// `key`; every member maps it and says whether it could; all use it only if
// all could (else null, with `why` set). The name is unlinked once every
// member has mapped it or given up.
std::unique_ptr<Segment> open_shared(const Group& g, c10d::Store& store, const std::string& key,
                                     const ShmOptions& options, std::string& why);

// The same for any layout of `bytes` whose first 16 bytes are {magic,
// nonce} (uint64 each, as Header's): rank 0 writes the nonce, calls
// init(base) for the rest of its header, then writes `magic` last; the
// others check both. shm_p2p.cpp's rings use it.
std::unique_ptr<Segment> open_shared_bytes(const Group& g, c10d::Store& store, const std::string& key,
                                           size_t bytes, uint64_t magic, int node,
                                           const std::function<void(char*)>& init, std::string& why);

// The futex system call on a counter's own 4 bytes (FUTEX_WAIT, FUTEX_WAKE).
long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout);

// Whether a counter that only grows (wrapping) has reached target.
inline bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

// Wakes every rank sleeping on c.
void wake_all(Counter& c);

// Returns once c reaches target: spins options.spin_us, then sleeps on the
// futex in 0.1 s slices, so a new round (round_abort.h) is noticed within
// 0.1 s; after options.timeout_s, dtrain::Error(timeout) naming the op, the
// group and what it waited for.
void wait_until(Counter& c, uint32_t target, const ShmOptions& options, const std::string& group,
                const char* op, const char* what);

// The dtypes the segments add: fp32, fp64, int32, int64.
bool shm_dtype(at::ScalarType t);

// acc = piece(0) (op) piece(1), then (op) piece(j) for j = 2..n-1 (n >= 2):
// rank order whatever the arrival order, so every path and machine gives the
// same bits (the first pair straight into acc, one pass fewer than copying
// piece 0 first; acc may be piece 0 itself).
void reduce_in_rank_order(at::Tensor& acc, int n, const std::function<at::Tensor(int)>& piece, ReduceOp op);

// The symmetric all-reduce's sum in one pass over its n regions (n >= 2):
// block by block (kSumBlockBytes, in L1), region 0's block gets the rank-order
// sum (regions[0][i] + regions[1][i] + ... in that order: the same bits as
// reduce_in_rank_order's adds) and is copied into the other regions' blocks
// while it is hot. 2n passes over memory where the sum then the copies take
// 3n - 1. fp32 and fp64 only: returns false (nothing written) otherwise.
constexpr int64_t kSumBlockBytes = 8192;
bool sum_to_all(char* const* regions, int n, int64_t elems, at::ScalarType dtype);

// The same rank-order sum into regions[0] alone (the others unchanged), for
// every dtype the segments add (shm_dtype): the hierarchical all-reduce's
// node stage on a symmetric buffer. False (nothing written) for another.
bool sum_to_first(char* const* regions, int n, int64_t elems, at::ScalarType dtype);

// The same rank-order sum of n >= 2 pieces into `out` (none of them),
// block by block: one pass over out where add_out then add_ per further
// piece take n - 1. The symmetric reduce-scatter's read. Every shm dtype;
// false (nothing written) for another.
bool sum_into(char* out, const char* const* pieces, int n, int64_t elems, at::ScalarType dtype);

// shm_buffer_bytes' count (symmetric_buffer.h): a buffer adds its bytes
// when made and takes them back from its tensor's deleter.
void count_shm_buffer_bytes(int64_t delta);
int64_t counted_shm_buffer_bytes();

}  // namespace dtrain::engine::comm::detail
