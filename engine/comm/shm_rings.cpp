// The rings behind shm_p2p.h (shm_rings.h). The segment: a control page (the
// {magic, nonce} id, then per member a doorbell, then per ring its written
// and read byte counters, each on a cache line of its own), then the rings'
// data, ring_bytes each; ring k carries ring_pairs(n)[k] = (from, to).
//   A record is a 16-byte head {tag, bytes} and the payload, padded to 16
// bytes, so a head never wraps round the ring's end. The sender copies in and
// advances `written`, the receiver copies out and advances `read`; each then
// rings the other's doorbell (a futex wake only when the other sleeps).
//   A rank sleeps on its own doorbell only: every peer that puts data into
// or takes data out of one of its rings rings it, so one futex word covers
// every ring it waits on.
//   Progress is made by whichever call of this rank's channel runs (a post
// or a wait): pending sends are pushed as far as their rings have room and
// arriving records are copied out, to the receive they match or, when it
// is not posted yet, to a buffer of their own (Gloo's matching: the earliest
// message from the peer with the receive's tag). So two ranks that send each
// other more than a ring holds before they receive cannot deadlock, and a
// send waits only for room in its ring, never for the receive to be posted.
#include "engine/comm/shm_rings.h"
#include "engine/comm/shm_segment.h"

#include <linux/futex.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "engine/comm/round_abort.h"

namespace dtrain::engine::comm::detail {

// One message's state on this rank; `t` keeps the caller's tensor alive
// until the message is through.
struct P2pOp {
  at::Tensor t;
  char* data = nullptr;
  uint64_t bytes = 0;
  uint64_t tag = 0;
  uint64_t moved = 0;  // payload bytes copied so far (sends)
  bool head = false;   // sends: the head is in the ring
  bool done = false;
  std::string error;  // receives: the message had another size (thrown by wait)
};

namespace {

constexpr uint64_t kP2pMagic = 0x3270705f6e696172;  // "rain_pp2"
constexpr uint64_t kHead = 16;                      // a record's head; payloads pad to it

struct RecordHead {
  uint64_t tag;
  uint64_t bytes;
};
static_assert(sizeof(RecordHead) == kHead, "a head is 16 bytes");

struct alignas(64) Bell {
  std::atomic<uint32_t> rings{0};     // the futex word: bumped by every peer that moved data
  std::atomic<uint32_t> sleeping{0};  // 1 while its owner may sleep on `rings`
};
struct alignas(64) Cursor {
  std::atomic<uint64_t> value{0};  // bytes through the ring since set-up
};
struct RingCtl {
  Cursor written, read;
};

// The directed pairs with a ring: every rank to its ring neighbours.
std::vector<std::pair<int, int>> ring_pairs(int n) {
  std::vector<std::pair<int, int>> pairs;
  for (int a = 0; a < n; ++a)
    for (int b : {(a + 1) % n, (a + n - 1) % n})
      if (b != a && std::find(pairs.begin(), pairs.end(), std::make_pair(a, b)) == pairs.end())
        pairs.emplace_back(a, b);
  return pairs;
}

size_t control_bytes(int n, size_t rings) {
  return round_to_page(64 + size_t(n) * sizeof(Bell) + rings * sizeof(RingCtl));
}

uint64_t padding(uint64_t bytes) { return (kHead - bytes % kHead) % kHead; }


// A record that came before its receive was posted.
struct Arrival {
  uint64_t tag = 0;
  std::unique_ptr<char[]> data;  // uninitialised: the record fills it
  uint64_t bytes = 0;
  void hold(uint64_t n) {
    data.reset(new char[n]);
    bytes = n;
  }
  bool complete = false;
  OpPtr waiter;  // the receive that took it while it was still arriving
};

struct OutRing {
  RingCtl* ctl = nullptr;
  char* data = nullptr;
  std::deque<OpPtr> queue;  // sends in post order; the front is being copied in
};

struct InRing {
  RingCtl* ctl = nullptr;
  char* data = nullptr;
  std::deque<OpPtr> posted;                    // receives not matched yet, in post order
  std::deque<std::shared_ptr<Arrival>> early;  // records not matched yet, in arrival order
  // The record being copied out (in_record): to `target` or `arrival`.
  bool in_record = false;
  uint64_t bytes = 0, got = 0;
  char* dst = nullptr;
  OpPtr target;
  std::shared_ptr<Arrival> arrival;
};

class P2pChannel : public ShmRings {
 public:
  P2pChannel(std::unique_ptr<Segment> seg, std::string group, int n, int me, ShmOptions options, uint64_t ring_bytes)
      : seg_(std::move(seg)), group_(std::move(group)), n_(n), me_(me), options_(options), cap_(ring_bytes),
        out_(size_t(n)), in_(size_t(n)) {
    const auto pairs = ring_pairs(n);
    char* base = seg_->base();
    bells_ = reinterpret_cast<Bell*>(base + 64);
    auto* ctl = reinterpret_cast<RingCtl*>(base + 64 + size_t(n) * sizeof(Bell));
    char* data = base + control_bytes(n, pairs.size());
    for (size_t k = 0; k < pairs.size(); ++k) {
      const auto [from, to] = pairs[k];
      if (from == me_) out_[size_t(to)] = {&ctl[k], data + k * cap_, {}};
      if (to == me_) {
        in_[size_t(from)].ctl = &ctl[k];
        in_[size_t(from)].data = data + k * cap_;
      }
    }
  }

  bool has_ring(int peer) const override {
    return peer >= 0 && peer < n_ && peer != me_ && out_[size_t(peer)].ctl != nullptr;
  }

  OpPtr post_send(const at::Tensor& t, int peer, int tag) override {
    auto op = make_op(t, tag);
    std::lock_guard<std::mutex> lock(mu_);
    out_[size_t(peer)].queue.push_back(op);
    progress();
    return op;
  }

  OpPtr post_recv(const at::Tensor& t, int peer, int tag) override {
    auto op = make_op(t, tag);
    std::lock_guard<std::mutex> lock(mu_);
    InRing& r = in_[size_t(peer)];
    auto it = std::find_if(r.early.begin(), r.early.end(), [&](const auto& a) { return a->tag == op->tag; });
    if (it == r.early.end()) {
      r.posted.push_back(op);
    } else {
      std::shared_ptr<Arrival> a = *it;
      r.early.erase(it);
      if (a->bytes != op->bytes) fail(*op, peer, a->bytes);  // dropped, arrived or not
      else if (a->complete) take(*a, *op);
      else a->waiter = op;
    }
    progress();
    return op;
  }

  // Makes progress until `op` is through: a timeout or the round's end throw.
  void wait(const OpPtr& op, const char* what, int peer) override {
    using Clock = std::chrono::steady_clock;
    Bell& mine = bells_[me_];
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(options_.timeout_s);
    bool spun = options_.spin_us <= 0;
    for (;;) {
      const uint32_t seen = mine.rings.load();  // before progress: a later ring is not lost
      {
        std::lock_guard<std::mutex> lock(mu_);
        progress();
        if (op->done && op->error.empty()) return;
        if (op->done)
          throw Error(ErrorCode::internal, op->error, "a send and its receive must have the same size");
      }
      if (!spun) {  // a peer that is running answers within microseconds
        spun = true;
        const auto spin_until = Clock::now() + std::chrono::microseconds(options_.spin_us);
        while (Clock::now() < spin_until && mine.rings.load(std::memory_order_acquire) == seen) {
        }
        continue;
      }
      throw_if_round_aborted("a shared-memory send/recv");  // no socket to shut down here
      if (Clock::now() >= deadline)
        throw Error(ErrorCode::timeout,
                    fmt::format("{} with rank {} (tag {}) on group {} (shared memory) waited {:g} s", what, peer,
                                op->tag, group_, options_.timeout_s),
                    "the peer did not send or receive the matching message in time (options.timeout_s); see "
                    "its log");
      // Sleep until a peer rings, or 0.1 s to check the deadline and the abort flag.
      mine.sleeping.store(1);
      const timespec slice{0, 100'000'000};
      if (mine.rings.load() == seen) futex(&mine.rings, FUTEX_WAIT, seen, &slice);
      mine.sleeping.store(0);
    }
  }

 private:
  static OpPtr make_op(const at::Tensor& t, int tag) {
    auto op = std::make_shared<P2pOp>();
    op->t = t;
    op->data = static_cast<char*>(t.data_ptr());
    op->bytes = t.nbytes();
    op->tag = static_cast<uint64_t>(tag);
    return op;
  }

  // A receive whose message has another size: its wait throws.
  void fail(P2pOp& op, int peer, uint64_t sent) const {
    op.error = fmt::format("recv on group {} (shared memory): rank {} sent {} bytes under tag {}, the receive "
                           "holds {}",
                           group_, peer, sent, op.tag, op.bytes);
    op.done = true;
    op.t.reset();
  }

  static void take(Arrival& a, P2pOp& op) {
    if (a.bytes > 0) std::memcpy(op.data, a.data.get(), a.bytes);
    op.done = true;
    op.t.reset();
  }

  void ring_bell(int peer) {
    Bell& b = bells_[peer];
    b.rings.fetch_add(1);
    if (b.sleeping.load()) futex(&b.rings, FUTEX_WAKE, INT_MAX, nullptr);
  }

  void copy_in(char* ring, uint64_t pos, const char* src, uint64_t n) const {
    if (n == 0) return;
    const uint64_t off = pos % cap_, first = std::min(n, cap_ - off);
    std::memcpy(ring + off, src, first);
    if (n > first) std::memcpy(ring, src + first, n - first);
  }
  void copy_out(const char* ring, uint64_t pos, char* dst, uint64_t n) const {
    if (n == 0) return;
    const uint64_t off = pos % cap_, first = std::min(n, cap_ - off);
    std::memcpy(dst, ring + off, first);
    if (n > first) std::memcpy(dst + first, ring, n - first);
  }

  void progress() {
    for (int p = 0; p < n_; ++p) {
      if (out_[size_t(p)].ctl != nullptr && push(out_[size_t(p)])) ring_bell(p);
      if (in_[size_t(p)].ctl != nullptr && drain(in_[size_t(p)], p)) ring_bell(p);
    }
  }

  // Copies the queued sends into the ring as far as it has room.
  bool push(OutRing& r) {
    uint64_t w = r.ctl->written.value.load(std::memory_order_relaxed);  // ours alone
    const uint64_t start = w;
    while (!r.queue.empty()) {
      P2pOp& s = *r.queue.front();
      uint64_t room = cap_ - (w - r.ctl->read.value.load(std::memory_order_acquire));
      if (!s.head) {
        if (room < kHead) break;
        const RecordHead head{s.tag, s.bytes};
        copy_in(r.data, w, reinterpret_cast<const char*>(&head), kHead);
        w += kHead;
        room -= kHead;
        s.head = true;
      }
      const uint64_t n = std::min(room, s.bytes - s.moved);
      copy_in(r.data, w, s.data + s.moved, n);
      w += n;
      room -= n;
      s.moved += n;
      if (s.moved < s.bytes || room < padding(s.bytes)) break;
      w += padding(s.bytes);
      s.done = true;
      s.t.reset();
      r.queue.pop_front();
    }
    if (w == start) return false;
    r.ctl->written.value.store(w, std::memory_order_release);
    return true;
  }

  // Copies arrived bytes out, to the receive each record matches.
  bool drain(InRing& r, int peer) {
    uint64_t rd = r.ctl->read.value.load(std::memory_order_relaxed);  // ours alone
    const uint64_t start = rd;
    for (;;) {
      uint64_t avail = r.ctl->written.value.load(std::memory_order_acquire) - rd;
      if (!r.in_record) {
        if (avail < kHead) break;
        RecordHead head{};
        copy_out(r.data, rd, reinterpret_cast<char*>(&head), kHead);
        rd += kHead;
        avail -= kHead;
        start_record(r, peer, head);
      }
      const uint64_t n = std::min(avail, r.bytes - r.got);
      copy_out(r.data, rd, r.dst + r.got, n);
      rd += n;
      avail -= n;
      r.got += n;
      if (r.got < r.bytes || avail < padding(r.bytes)) break;
      rd += padding(r.bytes);
      finish_record(r);
    }
    if (rd == start) return false;
    r.ctl->read.value.store(rd, std::memory_order_release);
    return true;
  }

  void start_record(InRing& r, int peer, const RecordHead& head) {
    r.in_record = true;
    r.bytes = head.bytes;
    r.got = 0;
    auto it = std::find_if(r.posted.begin(), r.posted.end(), [&](const OpPtr& op) { return op->tag == head.tag; });
    if (it != r.posted.end() && (*it)->bytes != head.bytes) {
      // The receive fails; the record still leaves the ring, into a buffer nobody takes.
      fail(**it, peer, head.bytes);
      r.posted.erase(it);
      r.arrival = std::make_shared<Arrival>();
      r.arrival->hold(head.bytes);
      r.dst = r.arrival->data.get();
    } else if (it != r.posted.end()) {
      r.target = *it;
      r.posted.erase(it);
      r.dst = r.target->data;
    } else {
      r.arrival = std::make_shared<Arrival>();
      r.arrival->tag = head.tag;
      r.arrival->hold(head.bytes);
      r.early.push_back(r.arrival);
      r.dst = r.arrival->data.get();
    }
  }

  void finish_record(InRing& r) {
    if (r.target) {
      r.target->done = true;
      r.target->t.reset();
    } else {
      r.arrival->complete = true;
      if (r.arrival->waiter) take(*r.arrival, *r.arrival->waiter);
    }
    r.in_record = false;
    r.target.reset();
    r.arrival.reset();
  }

  std::unique_ptr<Segment> seg_;
  std::string group_;
  int n_, me_;
  ShmOptions options_;
  uint64_t cap_;  // each ring's bytes, a multiple of 16
  Bell* bells_ = nullptr;
  std::mutex mu_;
  std::vector<OutRing> out_;  // by peer; ctl null: no ring to it
  std::vector<InRing> in_;    // by peer
};

}  // namespace

std::shared_ptr<ShmRings> open_shm_rings(const Group& g, c10d::Store& store, const std::string& key,
                                         const ShmOptions& options, int64_t ring_bytes, std::string& why) {
  const int n = g.size();
  const uint64_t cap = std::max<uint64_t>(4 * kHead, static_cast<uint64_t>(ring_bytes) / kHead * kHead);
  const size_t rings = ring_pairs(n).size();
  auto seg = open_shared_bytes(g, store, key, control_bytes(n, rings) + rings * cap, kP2pMagic, options.node,
                               [](char*) {}, why);
  if (!seg) return nullptr;
  if (g.rank() == 0)
    DTRAIN_DEBUG("group {} ({} ranks): send/recv between ring neighbours through shared memory ({} rings of {} KiB)",
                 g.name(), n, rings, cap >> 10);
  return std::make_shared<P2pChannel>(std::move(seg), g.name(), n, g.rank(), options, cap);
}

}  // namespace dtrain::engine::comm::detail
