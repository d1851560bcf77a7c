// symmetric_buffer.h's segment (shm_symmetric.h): a header page (or more)
// of per-slot counters and each member's claim, then one region per member.
// The k-th in-place all_reduce on it uses slot k % kSymSlots; every member
// writes its claim (the range's offset and length) and arrives. A sum
// (fp32, fp64) is shared: once all have arrived, member j sums the j-th of
// n cache-line-aligned pieces of the range in rank order into every
// member's range (sum_to_all on the piece), at its first chance: on
// arrival if it came last, else at a later op's arrival or at the op's
// wait(). Another op (max, min, other dtypes) is the last arriver's alone,
// over the whole range (reduce_in_rank_order, then copies). Each member
// checks the claims agree before its part, counts its part done, and the
// last part marks the slot done. A member does its parts in op order and
// does all of its earlier ones before it blocks on a later op, so no two
// members wait on each other. A slot is claimed again (op k + kSymSlots)
// only once op k is done, so the counters only grow; a member's range is
// not written again before its own wait() (DDP: the next backward), which
// comes after every member's part.
// A shared region (open_shared_region) is a header page then the elements,
// the same bytes for every member: no protocol, its users order their writes
// and reads with the group's own collectives.
#include "engine/comm/shm_symmetric.h"

#include <ATen/ops/add.h>
#include <ATen/ops/from_blob.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/ab_switch.h"
#include "common/error.h"
#include "common/log.h"
#include "engine/comm/gloo_group.h"
#include "engine/comm/shm_segment.h"

namespace dtrain::engine::comm::detail {

namespace {

constexpr uint64_t kSymMagic = 0x3179735f6e696172;     // "rain_sy1"
constexpr uint64_t kSharedMagic = 0x3168735f6e696172;  // "rain_sh1"
constexpr int kSymSlots = 64;

struct SymSlot {
  Counter arrived, done;         // arrived reaches n (k+1), done k+1, for the slot's k-th use
  // Members' parts of the use done (a share of a sum, a reduce_scatter's
  // read; the last arriver's whole reduction and the hierarchical leader's
  // stage count n): n (k+1) at the end of the k-th use.
  Counter parts;
  std::atomic<uint32_t> bad;     // k+1 where the k-th use's claims disagreed
  std::atomic<uint32_t> failed;  // k+1 where the k-th use's stage across nodes threw (hier)
};
struct SymClaim {
  uint64_t offset, bytes;
};
struct SymHeader {
  uint64_t magic;
  uint64_t nonce;
  uint64_t region_bytes;
  uint32_t members;
  SymSlot slots[kSymSlots];
  // then SymClaim claims[kSymSlots][members]
};

// DTRAIN_FUSED_SHM_SUM=0: the sum then the copies (reduce_in_rank_order and
// a memcpy per region), for A/B runs; the same bits either way.
bool fused_sum() {
  static const bool on = !switched_off("DTRAIN_FUSED_SHM_SUM");
  return on;
}

// DTRAIN_SHARED_SHM_SUM=0: the last member to arrive sums the whole range
// (the protocol before the shares), for A/B runs; the same bits either way.
// Read when a segment is made (so a test can run both in one process).
bool shared_sum() { return !switched_off("DTRAIN_SHARED_SHM_SUM"); }

size_t sym_header_bytes(int members) {
  return round_to_page(sizeof(SymHeader) + sizeof(SymClaim) * kSymSlots * static_cast<size_t>(members));
}

}  // namespace

class SymmetricSegment {
 public:
  SymmetricSegment(std::unique_ptr<Segment> seg, int members, int rank, std::string group, ShmOptions options)
      : seg_(std::move(seg)),
        n_(members),
        me_(rank),
        header_bytes_(sym_header_bytes(members)),
        group_(std::move(group)),
        options_(options),
        shared_sum_(fused_sum() && shared_sum()) {}

  SymHeader& header() const { return *reinterpret_cast<SymHeader*>(seg_->base()); }
  char* region(int j) const { return seg_->base() + header_bytes_ + static_cast<size_t>(j) * header().region_bytes; }
  int rank() const { return me_; }
  int64_t summed() const { return summed_.load(std::memory_order_relaxed); }

  // Arrives with t's range. A shared sum: this member's share is queued.
  // Then every queued part whose op all members have reached is done, in op
  // order (this op's own share where this member came last). Another op:
  // the last to arrive reduces the whole range. Returns the op's index.
  uint64_t arrive(const at::Tensor& t, ReduceOp op) {
    std::lock_guard<std::mutex> lock(mu_);
    const bool shared = op == ReduceOp::sum && shared_sum_ &&
                        (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
    const Arrival a = enter(t, "all_reduce");
    if (shared) parts_.push_back({a.index, nullptr, t.numel(), t.scalar_type()});
    settle(a.index, /*block=*/false);
    if (!shared && a.last) {
      const int s = static_cast<int>(a.index % kSymSlots);
      const auto use = static_cast<uint32_t>(a.index / kSymSlots);
      SymSlot& slot = header().slots[s];
      if (claims_agree(s)) {
        reduce(claim(s, me_), t.numel(), t.scalar_type(), op);
        if (op == ReduceOp::sum) summed_.fetch_add(t.numel(), std::memory_order_relaxed);
      } else {
        slot.bad.store(use + 1, std::memory_order_relaxed);
      }
      finish_part(slot, use, n_);
    }
    return a.index;
  }

  // The hierarchical all-reduce's node stages on t's range (hier_group.cpp):
  // every member claims its range and arrives; member 0 (the node's leader)
  // waits for all, sums the ranges into its own in member order, runs
  // `across` on it (the leaders' all-reduce), copies the result into the
  // others' ranges and marks the slot done; the others only wait for that.
  // Claims that differ: member 0 still runs `across` (the other nodes'
  // leaders are in it), then every member throws.
  void hier(const at::Tensor& t, const std::function<void(at::Tensor&)>& across) {
    uint64_t index = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      index = enter(t, "all_reduce").index;
      if (index > 0) settle(index - 1, /*block=*/true);  // this member's earlier parts before it blocks
    }
    const int s = static_cast<int>(index % kSymSlots);
    const auto use = static_cast<uint32_t>(index / kSymSlots);
    SymSlot& slot = header().slots[s];
    if (me_ != 0) {
      wait_until(slot.done, use + 1, options_, group_, "all_reduce", "the node leader's sum and exchange");
      if (slot.failed.load(std::memory_order_relaxed) == use + 1)
        throw Error(ErrorCode::worker_failed, "all_reduce on group " + group_ +
                                         " (hierarchical, symmetric buffer): the node leader's exchange across "
                                         "nodes failed (its log says why)",
                    "see the node leader's error");
      check_claims(slot, use);
      return;
    }
    wait_until(slot.arrived, static_cast<uint32_t>(n_) * (use + 1), options_, group_, "all_reduce",
               "every member of the node");
    const bool agree = claims_agree(s);
    const SymClaim mine = claim(s, me_);
    std::vector<char*> ranges = ranges_at(mine.offset);
    // (symmetric buffers hold only dtypes sum_to_first adds)
    if (agree) sum_to_first(ranges.data(), n_, t.numel(), t.scalar_type());
    std::exception_ptr err;
    try {
      at::Tensor x = t;  // member 0's range
      across(x);
    } catch (...) {
      err = std::current_exception();
    }
    if (agree && !err)
      for (int j = 1; j < n_; ++j) std::memcpy(ranges[size_t(j)], ranges[0], mine.bytes);
    if (!agree) slot.bad.store(use + 1, std::memory_order_relaxed);
    if (err) slot.failed.store(use + 1, std::memory_order_relaxed);
    finish_part(slot, use, n_);
    if (err) std::rethrow_exception(err);
    check_claims(slot, use);
  }

  // reduce_scatter of `in` (a range of this member's region, n blocks of
  // out.numel()) into `out`: every member claims and arrives. The read
  // (this member's block of every member's range, in member order, into
  // out) comes at the first arrival (this op's or a later one's) that finds
  // every member arrived, else at the work's wait(); wait() then waits
  // until every member has read, so a member writes its range again only
  // after the others are done with it.
  struct Read {
    uint64_t index;
    at::Tensor out;  // kept alive until read
    bool read = false, agree = true;
  };
  // A part of an op this member has still to do: a reduce_scatter's read
  // (read set), or its share of a sum (read null).
  struct Part {
    uint64_t index;
    std::shared_ptr<Read> read;
    int64_t elems;
    at::ScalarType dtype;
  };
  std::shared_ptr<Read> arrive_reduce_scatter(const at::Tensor& in, const at::Tensor& out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = std::make_shared<Read>(Read{enter(in, "reduce_scatter").index, out});
    parts_.push_back({r->index, r, 0, in.scalar_type()});
    settle(r->index, /*block=*/false);
    return r;
  }
  void wait_read(Read& r) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      settle(r.index, /*block=*/true);  // reads r, after this member's earlier parts
    }
    const auto use = static_cast<uint32_t>(r.index / kSymSlots);
    wait_until(header().slots[r.index % kSymSlots].done, use + 1, options_, group_, "reduce_scatter",
               "every member reading its block");
    if (!r.agree)
      throw Error(ErrorCode::internal,
                  "reduce_scatter on group " + group_ +
                      " (symmetric buffer): the members passed different ranges of their buffers, or an output "
                      "that is not 1/" + std::to_string(n_) + " of them",
                  "every member reduce-scatters the same offset and length of its symmetric_buffer, in the same "
                  "order");
  }

  void wait(uint64_t index) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      settle(index, /*block=*/true);  // this member's parts up to this op's share
    }
    SymSlot& slot = header().slots[index % kSymSlots];
    const auto use = static_cast<uint32_t>(index / kSymSlots);
    wait_until(slot.done, use + 1, options_, group_, "all_reduce", "every member's part of the in-place reduction");
    check_claims(slot, use);
  }

 private:
  // The next op: takes its slot (once this member's own parts of the
  // slot's earlier uses, and of every op before them, are done, then every
  // member's earlier use is done), claims t's range (offset in this
  // member's region, bytes) and arrives, waking whoever waits for the
  // arrivals. Under mu_.
  struct Arrival {
    uint64_t index;
    bool last;  // this member arrived last
  };
  Arrival enter(const at::Tensor& t, const char* op) {
    const uint64_t index = next_++;
    const int s = static_cast<int>(index % kSymSlots);
    const auto use = static_cast<uint32_t>(index / kSymSlots);
    SymSlot& slot = header().slots[s];
    if (use > 0) {
      settle(index - kSymSlots, /*block=*/true);
      wait_until(slot.done, use, options_, group_, op, "reusing a symmetric-buffer slot");
    }
    claim(s, me_) = {static_cast<uint64_t>(static_cast<const char*>(t.data_ptr()) - region(me_)),
                     static_cast<uint64_t>(t.nbytes())};
    const bool last =
        slot.arrived.value.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(n_) * (use + 1);
    if (last) wake_all(slot.arrived);
    return {index, last};
  }
  // Every member claimed the same range of slot s (all have arrived).
  bool claims_agree(int s) const {
    for (int j = 1; j < n_; ++j)
      if (claim(s, j).offset != claim(s, 0).offset || claim(s, j).bytes != claim(s, 0).bytes) return false;
    return true;
  }
  // A reduce_scatter's read (arrive_reduce_scatter). Under mu_.
  void read(Read& r) {
    const int s = static_cast<int>(r.index % kSymSlots);
    const auto use = static_cast<uint32_t>(r.index / kSymSlots);
    SymSlot& slot = header().slots[s];
    const uint32_t all = static_cast<uint32_t>(n_) * (use + 1);
    wait_until(slot.arrived, all, options_, group_, "reduce_scatter", "every member's input");
    const SymClaim first = claim(s, 0);
    r.agree = claims_agree(s) && first.bytes == static_cast<uint64_t>(r.out.nbytes()) * static_cast<uint64_t>(n_);
    if (r.agree) {
      // As the staged path: out = piece 0 + piece 1, then + piece j (the
      // same bits), in one pass over out (sum_into; ATen's adds for a dtype
      // it does not take).
      const int64_t m = r.out.numel();
      const size_t bytes = r.out.nbytes();
      std::vector<const char*> pieces(static_cast<size_t>(n_));
      for (int j = 0; j < n_; ++j) pieces[size_t(j)] = region(j) + first.offset + static_cast<size_t>(me_) * bytes;
      char* dst = static_cast<char*>(r.out.data_ptr());
      const bool apart = std::none_of(pieces.begin(), pieces.end(),
                                      [&](const char* p) { return p < dst + bytes && dst < p + bytes; });
      if (!r.out.is_contiguous() || !apart || !sum_into(dst, pieces.data(), n_, m, r.out.scalar_type())) {
        auto opts = at::TensorOptions().dtype(r.out.scalar_type());
        auto piece = [&](int j) { return at::from_blob(const_cast<char*>(pieces[size_t(j)]), {m}, opts); };
        at::add_out(r.out, piece(0), piece(1));
        for (int j = 2; j < n_; ++j) r.out.add_(piece(j));
      }
    }
    r.read = true;
    r.out = at::Tensor();
    finish_part(slot, use, 1);
  }
  // This member's queued parts of ops up to index `through`, in op order.
  // block: waits for each op's arrivals; else stops at the first op some
  // member has not reached. Under mu_.
  void settle(uint64_t through, bool block) {
    while (!parts_.empty() && parts_.front().index <= through) {
      Part& p = parts_.front();
      const auto use = static_cast<uint32_t>(p.index / kSymSlots);
      SymSlot& slot = header().slots[p.index % kSymSlots];
      if (!block && !reached(slot.arrived.value.load(std::memory_order_acquire), static_cast<uint32_t>(n_) * (use + 1)))
        return;
      if (p.read) {
        if (!p.read->read) read(*p.read);
      } else {
        share(p);
      }
      parts_.pop_front();
    }
  }
  // A shared sum's part: this member's piece of the range (n pieces, each
  // a whole number of 64-byte lines but the last), summed in rank order
  // into every member's range.
  void share(const Part& p) {
    const int s = static_cast<int>(p.index % kSymSlots);
    const auto use = static_cast<uint32_t>(p.index / kSymSlots);
    SymSlot& slot = header().slots[s];
    wait_until(slot.arrived, static_cast<uint32_t>(n_) * (use + 1), options_, group_, "all_reduce",
               "every member's arrival");
    if (claims_agree(s)) {
      const int64_t esize = static_cast<int64_t>(c10::elementSize(p.dtype));
      const int64_t line = 64 / esize;
      const int64_t piece = ((p.elems + n_ - 1) / n_ + line - 1) / line * line;
      const int64_t lo = std::min(p.elems, piece * me_), hi = std::min(p.elems, lo + piece);
      if (hi > lo) {
        const uint64_t at = claim(s, me_).offset + static_cast<uint64_t>(lo * esize);
        std::vector<char*> ranges = ranges_at(at);
        sum_to_all(ranges.data(), n_, hi - lo, p.dtype);
        summed_.fetch_add(hi - lo, std::memory_order_relaxed);
      }
    } else {
      slot.bad.store(use + 1, std::memory_order_relaxed);
    }
    finish_part(slot, use, 1);
  }
  // k parts of the slot's use-th use done; the last marks it done.
  void finish_part(SymSlot& slot, uint32_t use, int k) {
    const auto add = static_cast<uint32_t>(k);
    if (slot.parts.value.fetch_add(add, std::memory_order_acq_rel) + add == static_cast<uint32_t>(n_) * (use + 1)) {
      slot.done.value.store(use + 1, std::memory_order_release);
      wake_all(slot.done);
    }
  }
  void check_claims(const SymSlot& slot, uint32_t use) const {
    if (slot.bad.load(std::memory_order_relaxed) == use + 1)
      throw Error(ErrorCode::internal,
                  "all_reduce on group " + group_ +
                      " (symmetric buffer): the members passed different ranges of their buffers",
                  "every member all-reduces the same offset and length of its symmetric_buffer, in the same order");
  }
  // Every member's region at byte `offset`, member order.
  std::vector<char*> ranges_at(uint64_t offset) const {
    std::vector<char*> r(static_cast<size_t>(n_));
    for (int j = 0; j < n_; ++j) r[size_t(j)] = region(j) + offset;
    return r;
  }
  SymClaim& claim(int s, int j) const {
    auto* claims = reinterpret_cast<SymClaim*>(seg_->base() + sizeof(SymHeader));
    return claims[static_cast<size_t>(s) * n_ + j];
  }
  void reduce(const SymClaim& c, int64_t elems, at::ScalarType dtype, ReduceOp op) {
    if (op == ReduceOp::sum && fused_sum()) {
      std::vector<char*> ranges = ranges_at(c.offset);
      if (sum_to_all(ranges.data(), n_, elems, dtype)) return;
    }
    auto opts = at::TensorOptions().dtype(dtype);
    auto piece = [&](int j) { return at::from_blob(region(j) + c.offset, {elems}, opts); };
    at::Tensor acc = piece(0);
    reduce_in_rank_order(acc, n_, piece, op);
    for (int j = 1; j < n_; ++j) std::memcpy(region(j) + c.offset, region(0) + c.offset, c.bytes);
  }

  std::unique_ptr<Segment> seg_;
  int n_, me_;
  size_t header_bytes_;
  std::string group_;
  ShmOptions options_;
  const bool shared_sum_;  // sums shared (fused_sum and shared_sum when made)
  std::mutex mu_;
  uint64_t next_ = 0;
  std::deque<Part> parts_;  // this member's parts not yet done, in op order
  std::atomic<int64_t> summed_{0};  // elements of all_reduce sums this member added up
};

namespace {

class SymWork : public Work {
 public:
  SymWork(std::shared_ptr<SymmetricSegment> seg, uint64_t index) : seg_(std::move(seg)), index_(index) {}
  void wait() override { seg_->wait(index_); }

 private:
  std::shared_ptr<SymmetricSegment> seg_;
  uint64_t index_;
};

// Whether `bytes` fit in a quarter of /dev/shm (the same answer on every
// member: one machine); else member 0 says so.
bool fits_dev_shm(const Group& g, size_t bytes, const char* what) {
  struct statvfs fs {};
  const size_t cap = statvfs("/dev/shm", &fs) == 0 ? static_cast<size_t>(fs.f_blocks) * fs.f_frsize / 4 : 0;
  if (bytes <= cap) return true;
  if (g.rank() == 0)
    DTRAIN_INFO("group {}: {} MB of {} would exceed a quarter of /dev/shm ({} MB)", g.name(), bytes >> 20, what,
                cap >> 20);
  return false;
}

class SymScatterWork : public Work {
 public:
  SymScatterWork(std::shared_ptr<SymmetricSegment> seg, std::shared_ptr<SymmetricSegment::Read> read)
      : seg_(std::move(seg)), read_(std::move(read)) {}
  void wait() override { seg_->wait_read(*read_); }

 private:
  std::shared_ptr<SymmetricSegment> seg_;
  std::shared_ptr<SymmetricSegment::Read> read_;
};

}  // namespace

std::shared_ptr<SymmetricSegment> open_symmetric(const Group& g, c10d::Store& store, const std::string& key,
                                                 int64_t numel, at::ScalarType dtype, const ShmOptions& options) {
  if (!shm_dtype(dtype) || numel <= 0) return nullptr;
  const int n = g.size();
  const size_t region = round_to_page(static_cast<size_t>(numel) * c10::elementSize(dtype));
  const size_t bytes = sym_header_bytes(n) + region * static_cast<size_t>(n);
  if (!fits_dev_shm(g, bytes, "symmetric buffers (its all-reduces stage through the segment)")) return nullptr;
  std::string why;
  std::unique_ptr<Segment> seg;
  try {
    seg = open_shared_bytes(g, store, key, bytes, kSymMagic, options.node,
                            [&](char* base) {
                              auto& h = *reinterpret_cast<SymHeader*>(base);
                              h.region_bytes = region;
                              h.members = static_cast<uint32_t>(n);
                            },
                            why);
  } catch (...) {
    rethrow_comm_error(g.name(), "setting up a symmetric buffer");
  }
  if (!seg) {
    if (g.rank() == 0) DTRAIN_INFO("group {}: no symmetric buffer ({}): its all-reduces stage", g.name(), why);
    return nullptr;
  }
  // posix_fallocate gave zeroed pages.
  return std::make_shared<SymmetricSegment>(std::move(seg), n, g.rank(), g.name(), options);
}

at::Tensor open_shared_region(const Group& g, c10d::Store& store, const std::string& key, int64_t numel,
                              at::ScalarType dtype, const ShmOptions& options) {
  if (numel <= 0) return {};
  const size_t header = round_to_page(2 * sizeof(uint64_t));  // {magic, nonce}
  const size_t bytes = header + round_to_page(static_cast<size_t>(numel) * c10::elementSize(dtype));
  if (!fits_dev_shm(g, bytes, "a shared buffer (none made)")) return {};
  std::string why;
  std::unique_ptr<Segment> seg;
  try {
    seg = open_shared_bytes(g, store, key, bytes, kSharedMagic, options.node, [](char*) {}, why);
  } catch (...) {
    rethrow_comm_error(g.name(), "setting up a shared buffer");
  }
  if (!seg) {
    if (g.rank() == 0) DTRAIN_INFO("group {}: no shared buffer ({})", g.name(), why);
    return {};
  }
  std::shared_ptr<Segment> owner(std::move(seg));  // posix_fallocate gave zeroed pages
  // This member's share of the one copy (shm_buffer_bytes).
  const int64_t share = numel * static_cast<int64_t>(c10::elementSize(dtype)) / std::max(1, g.size());
  count_shm_buffer_bytes(share);
  return at::from_blob(
      owner->base() + header, {numel}, [owner, share](void*) { count_shm_buffer_bytes(-share); },
      at::TensorOptions().dtype(dtype));
}

char* symmetric_region(const SymmetricSegment& s) { return s.region(s.rank()); }

int64_t symmetric_summed_elements(const SymmetricSegment& s) { return s.summed(); }

bool symmetric_holds(const SymmetricSegment& s, const at::Tensor& t) {
  if (!t.device().is_cpu() || !t.is_contiguous() || !shm_dtype(t.scalar_type()) || t.numel() == 0) return false;
  const char* p = static_cast<const char*>(t.data_ptr());
  const char* mine = s.region(s.rank());
  return p >= mine && p + t.nbytes() <= mine + s.header().region_bytes;
}

WorkPtr symmetric_all_reduce(const std::shared_ptr<SymmetricSegment>& s, const at::Tensor& t, ReduceOp op) {
  return std::make_shared<SymWork>(s, s->arrive(t, op));
}

WorkPtr symmetric_reduce_scatter(const std::shared_ptr<SymmetricSegment>& s, const at::Tensor& in,
                                 const at::Tensor& out) {
  return std::make_shared<SymScatterWork>(s, s->arrive_reduce_scatter(in, out));
}

void symmetric_hier_all_reduce(SymmetricSegment& s, const at::Tensor& t,
                               const std::function<void(at::Tensor&)>& across) {
  s.hier(t, across);
}

}  // namespace dtrain::engine::comm::detail
