// The shared-memory collectives (shm_group.h). The segment has kSets sets,
// each with one staging slot per rank and one result slot; chunk c of the
// group's shared-memory ops (in call order, the same on every rank) uses
// set c % kSets:
//   1. every rank copies its part of the chunk into its slot and arrives
//      (all_reduce, all_gather: its piece; reduce_scatter: its n pieces,
//      one for each rank's block; broadcast: the root its piece, the others
//      nothing; reduce: every rank but rank 0 its piece);
//   2. the last to arrive (already running: no one waits to be scheduled)
//      marks the set done; for all_reduce it first reduces slots 0..n-1 in
//      rank order into the result slot (the same addition order whatever the
//      arrival order, the chunking or the machine);
//   3. each rank takes its result as soon as it sees it in (the last to
//      arrive at once; the others at their next launch, their wait for the
//      op, or when they need the set again) and counts itself consumed:
//      all_reduce copies the result slot out, all_gather copies every
//      rank's slot to its place, reduce_scatter reduces its own block from
//      every slot, in rank order, into its output, broadcast copies the
//      root's slot out, reduce adds slots 1..n-1 in rank order into rank
//      0's own tensor (the others take nothing).
// A set is staged again (chunk c + kSets) only once every rank consumed it.
// Waits spin briefly, then sleep on a futex in the segment, so a machine
// with more ranks than cores gives its cores to the ranks that compute.
// An all_reduce of a tensor in one of the group's symmetric buffers
// (symmetric_buffer.h) skips the staging and runs in place (shm_symmetric.cpp).
#include "engine/comm/shm_group.h"
#include "engine/comm/shm_segment.h"
#include "engine/comm/hier_group.h"
#include "engine/comm/shm_symmetric.h"

#include <ATen/ops/add.h>
#include <ATen/ops/from_blob.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "common/ab_switch.h"
#include "common/log.h"
#include "engine/comm/forwarding_group.h"
#include "engine/comm/gloo_group.h"
#include "engine/comm/symmetric_buffer.h"

namespace dtrain::engine::comm::detail {

namespace {

enum class ShmOp { all_reduce, all_gather, reduce_scatter, broadcast, reduce };

const char* op_name(ShmOp op) {
  switch (op) {
    case ShmOp::all_reduce: return "all_reduce";
    case ShmOp::all_gather: return "all_gather";
    case ShmOp::reduce_scatter: return "reduce_scatter";
    case ShmOp::broadcast: return "broadcast";
    case ShmOp::reduce: return "reduce";
  }
  return "?";
}

// The group's side of the segment: stages chunks, reduces as the last
// arriver, takes results out. Shared by the group and its works.
class ShmChannel {
 public:
  ShmChannel(std::unique_ptr<Segment> seg, std::string group, int members, int rank, ShmOptions options)
      : seg_(std::move(seg)), group_(std::move(group)), n_(members), me_(rank), options_(options) {}

  struct Chunk {
    uint64_t index;
    ShmOp op;
    char* dst;       // the result's place in the caller's output (all_gather: rank 0's piece)
    int64_t elems;   // per rank piece
    int64_t stride;  // all_gather: bytes between two ranks' pieces in the output; broadcast: the root
    at::ScalarType dtype;
    ReduceOp reduce;
    bool consumed = false;
  };
  using ChunkPtr = std::shared_ptr<Chunk>;

  // all_reduce: stages every chunk of t (contiguous, CPU) in place.
  std::vector<ChunkPtr> stage_all_reduce(const at::Tensor& t, ReduceOp op) {
    return stage_in_place(t, ShmOp::all_reduce, 0, op, /*stages=*/true);
  }

  // all_gather: in [m] -> out [n m], rank j's piece at j m.
  std::vector<ChunkPtr> stage_all_gather(const at::Tensor& in, const at::Tensor& out) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t es = static_cast<int64_t>(in.element_size()), m = in.numel();
    const int64_t per_chunk = slot_bytes() / es;
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    std::vector<ChunkPtr> chunks;
    for (int64_t off = 0; off < m; off += per_chunk) {
      const int64_t elems = std::min(per_chunk, m - off);
      chunks.push_back(
          stage_chunk({0, ShmOp::all_gather, dst + off * es, elems, m * es, in.scalar_type(), ReduceOp::sum},
                      [&](char* slot) { std::memcpy(slot, src + off * es, size_t(elems * es)); }));
    }
    return chunks;
  }

  // broadcast: t [m] of rank `root` to every rank's t; only the root stages.
  std::vector<ChunkPtr> stage_broadcast(const at::Tensor& t, int root) {
    return stage_in_place(t, ShmOp::broadcast, root, ReduceOp::sum, /*stages=*/me_ == root);
  }

  // reduce (sum) to rank 0: t of every rank added into rank 0's t; rank 0
  // stages nothing (its t is the accumulator), the others' t stay as they are.
  std::vector<ChunkPtr> stage_reduce(const at::Tensor& t) {
    return stage_in_place(t, ShmOp::reduce, 0, ReduceOp::sum, /*stages=*/me_ != 0);
  }

  // reduce_scatter (sum): in [n m] -> out [m] = sum over ranks of block rank.
  std::vector<ChunkPtr> stage_reduce_scatter(const at::Tensor& in, const at::Tensor& out) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t es = static_cast<int64_t>(in.element_size()), m = out.numel();
    const int64_t per_chunk = slot_bytes() / (es * n_);  // one piece per rank's block in a slot
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    std::vector<ChunkPtr> chunks;
    for (int64_t off = 0; off < m; off += per_chunk) {
      const int64_t elems = std::min(per_chunk, m - off);
      chunks.push_back(stage_chunk(
          {0, ShmOp::reduce_scatter, dst + off * es, elems, 0, in.scalar_type(), ReduceOp::sum},
          [&](char* slot) {
            for (int j = 0; j < n_; ++j)
              std::memcpy(slot + j * elems * es, src + (j * m + off) * es, size_t(elems * es));
          }));
    }
    return chunks;
  }

  // Takes each chunk's result (waiting for it), in any order.
  void finish(const std::vector<ChunkPtr>& chunks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : chunks) consume(*c);
    while (!pending_.empty() && pending_.front()->consumed) pending_.pop_front();
  }

  int64_t slot_bytes() const { return static_cast<int64_t>(seg_->header().slot_bytes); }

 private:
  // The chunks of t (contiguous, CPU), whose result goes back into t; this
  // rank copies each into its slot where `stages`.
  std::vector<ChunkPtr> stage_in_place(const at::Tensor& t, ShmOp op, int64_t stride, ReduceOp reduce,
                                       bool stages) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t es = static_cast<int64_t>(t.element_size());
    const int64_t per_chunk = slot_bytes() / es;
    char* data = static_cast<char*>(t.data_ptr());
    std::vector<ChunkPtr> chunks;
    for (int64_t off = 0; off < t.numel(); off += per_chunk) {
      const int64_t elems = std::min(per_chunk, t.numel() - off);
      chunks.push_back(stage_chunk({0, op, data + off * es, elems, stride, t.scalar_type(), reduce},
                                   [&](char* slot) {
                                     if (stages) std::memcpy(slot, data + off * es, size_t(elems * es));
                                   }));
    }
    return chunks;
  }
  void wait_until(Counter& c, uint32_t target, ShmOp op, const char* what) {
    detail::wait_until(c, target, options_, group_, op_name(op), what);
  }
  ChunkPtr stage_chunk(Chunk chunk, const std::function<void(char*)>& fill);
  void consume(Chunk& c);
  void consume_ready();  // takes the pending chunks whose result is in, oldest first
  void reduce_into_result(int set, int64_t elems, at::ScalarType dtype, ReduceOp op);

  std::unique_ptr<Segment> seg_;
  std::string group_;
  int n_, me_;
  ShmOptions options_;
  std::mutex mu_;
  uint64_t next_ = 0;               // the next chunk's index
  std::deque<ChunkPtr> pending_;    // staged and not yet consumed, in index order
};

void ShmChannel::reduce_into_result(int set, int64_t elems, at::ScalarType dtype, ReduceOp op) {
  auto opts = at::TensorOptions().dtype(dtype);
  auto view = [&](int index) { return at::from_blob(seg_->slot(set, index), {elems}, opts); };
  at::Tensor acc = view(n_);  // [elems]
  if (n_ == 1) {
    acc.copy_(view(0));
    return;
  }
  reduce_in_rank_order(acc, n_, view, op);
}

ShmChannel::ChunkPtr ShmChannel::stage_chunk(Chunk chunk, const std::function<void(char*)>& fill) {
  const uint64_t index = next_++;
  const int set = static_cast<int>(index % kSets);
  const uint32_t use = static_cast<uint32_t>(index / kSets);  // this set's use number k
  SetState& st = seg_->header().sets[set];
  // Results already in: taken now, so the ranks ahead find their sets free
  // (a set waits for every rank's copy-out, not only for its staging).
  consume_ready();
  if (use > 0) {
    // The set's previous chunk: ours copied out first, then everyone's.
    while (!pending_.empty() && pending_.front()->index + kSets <= index) {
      consume(*pending_.front());
      pending_.pop_front();
    }
    wait_until(st.consumed, static_cast<uint32_t>(n_) * use, chunk.op, "reusing a staging set");
  }
  fill(seg_->slot(set, me_));
  chunk.index = index;
  auto ptr = std::make_shared<Chunk>(chunk);
  pending_.push_back(ptr);
  const uint32_t all = static_cast<uint32_t>(n_) * (use + 1);
  if (st.staged.value.fetch_add(1, std::memory_order_acq_rel) + 1 == all) {
    if (chunk.op == ShmOp::all_reduce) reduce_into_result(set, chunk.elems, chunk.dtype, chunk.reduce);
    st.done.value.store(use + 1, std::memory_order_release);
    wake_all(st.done);
    // The last to arrive takes its result at once (still in cache), and with
    // the earlier ones: a rank ahead then waits for this rank's staging only.
    consume_ready();
  }
  return ptr;
}

void ShmChannel::consume_ready() {
  while (!pending_.empty()) {
    Chunk& c = *pending_.front();
    if (!c.consumed) {
      const uint32_t use = static_cast<uint32_t>(c.index / kSets);
      if (!reached(seg_->header().sets[c.index % kSets].done.value.load(std::memory_order_acquire), use + 1)) return;
      consume(c);
    }
    pending_.pop_front();
  }
}

void ShmChannel::consume(Chunk& c) {
  if (c.consumed) return;
  const int set = static_cast<int>(c.index % kSets);
  const uint32_t use = static_cast<uint32_t>(c.index / kSets);
  SetState& st = seg_->header().sets[set];
  wait_until(st.done, use + 1, c.op, c.op == ShmOp::all_reduce ? "the last rank's reduction" : "every rank's part");
  const int64_t es = static_cast<int64_t>(c10::elementSize(c.dtype));
  const size_t bytes = static_cast<size_t>(c.elems * es);
  if (c.op == ShmOp::all_reduce) {
    std::memcpy(c.dst, seg_->slot(set, n_), bytes);
  } else if (c.op == ShmOp::broadcast) {
    if (me_ != c.stride) std::memcpy(c.dst, seg_->slot(set, static_cast<int>(c.stride)), bytes);
  } else if (c.op == ShmOp::reduce) {
    if (me_ == 0) {  // rank 0's own piece, then slots 1..n-1: rank order
      auto opts = at::TensorOptions().dtype(c.dtype);
      at::Tensor acc = at::from_blob(c.dst, {c.elems}, opts);
      for (int j = 1; j < n_; ++j) acc.add_(at::from_blob(seg_->slot(set, j), {c.elems}, opts));
    }
  } else if (c.op == ShmOp::all_gather) {
    for (int j = 0; j < n_; ++j) std::memcpy(c.dst + j * c.stride, seg_->slot(set, j), bytes);
  } else {
    // This rank's block from every slot, added in rank order straight into
    // the output (the first pair without a copy).
    auto opts = at::TensorOptions().dtype(c.dtype);
    auto piece = [&](int j) { return at::from_blob(seg_->slot(set, j) + me_ * c.elems * es, {c.elems}, opts); };
    at::Tensor out = at::from_blob(c.dst, {c.elems}, opts);
    at::add_out(out, piece(0), piece(1));
    for (int j = 2; j < n_; ++j) out.add_(piece(j));
  }
  c.consumed = true;
  if (st.consumed.value.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(n_) * (use + 1))
    wake_all(st.consumed);
}

class ShmWork : public Work {
 public:
  ShmWork(std::shared_ptr<ShmChannel> channel, at::Tensor t, std::vector<ShmChannel::ChunkPtr> chunks)
      : channel_(std::move(channel)), t_(std::move(t)), chunks_(std::move(chunks)) {}
  void wait() override { channel_->finish(chunks_); }

 private:
  std::shared_ptr<ShmChannel> channel_;
  at::Tensor t_;  // keeps the result's memory alive until wait()
  std::vector<ShmChannel::ChunkPtr> chunks_;
};

class ShmGroup : public ForwardingGroup {
 public:
  ShmGroup(std::unique_ptr<Group> inner, std::shared_ptr<ShmChannel> channel,
           c10::intrusive_ptr<c10d::Store> store, std::string key, ShmOptions options)
      : ForwardingGroup(std::move(inner)),
        channel_(std::move(channel)),
        store_(std::move(store)),
        key_(std::move(key)),
        options_(options) {}

  std::string path() const override { return "shm"; }

  WorkPtr all_reduce(at::Tensor& t, bool async, ReduceOp op) override {
    if (!summable(t)) return inner_->all_reduce(t, async, op);
    const int n = size();
    bytes_ += static_cast<uint64_t>(2 * (n - 1) * static_cast<int64_t>(t.nbytes()) / n);
    if (auto sym = holding(t)) {
      auto work = symmetric_all_reduce(sym, t, op);
      if (!async) work->wait();
      return work;
    }
    auto work = std::make_shared<ShmWork>(channel_, t, channel_->stage_all_reduce(t, op));
    if (!async) work->wait();
    return work;
  }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out, bool async) override {
    if (!eligible(in, out) || out.numel() != size() * in.numel()) return inner_->all_gather(in, out, async);
    bytes_ += static_cast<uint64_t>((size() - 1) * static_cast<int64_t>(in.nbytes()));
    auto work = std::make_shared<ShmWork>(channel_, out, channel_->stage_all_gather(in, out));
    if (!async) work->wait();
    return work;
  }
  WorkPtr broadcast(at::Tensor& t, int root, bool async) override {
    // (any dtype: nothing is added)
    if (!t.device().is_cpu() || !t.is_contiguous() || t.numel() == 0 || root < 0 || root >= size() ||
        channel_->slot_bytes() < static_cast<int64_t>(t.element_size()))
      return inner_->broadcast(t, root, async);
    bytes_ += static_cast<uint64_t>((size() - 1) * static_cast<int64_t>(t.nbytes()) / size());
    auto work = std::make_shared<ShmWork>(channel_, t, channel_->stage_broadcast(t, root));
    if (!async) work->wait();
    return work;
  }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, bool async) override {
    // (a slot holds one piece per rank: too many ranks for the slot size, Gloo)
    if (!eligible(in, out) || in.numel() != size() * out.numel() ||
        channel_->slot_bytes() < static_cast<int64_t>(in.element_size()) * size())
      return inner_->reduce_scatter(in, out, async);
    bytes_ += static_cast<uint64_t>((size() - 1) * static_cast<int64_t>(in.nbytes()) / size());
    if (auto sym = holding(in)) {  // every member's input read where it lies: nothing staged
      auto work = symmetric_reduce_scatter(sym, in, out);
      if (!async) work->wait();
      return work;
    }
    auto work = std::make_shared<ShmWork>(channel_, out, channel_->stage_reduce_scatter(in, out));
    if (!async) work->wait();
    return work;
  }
  // shm_reduce_to_first (shm_group.h).
  bool reduce_to_first(at::Tensor& t) {
    if (!summable(t) || t.numel() == 0) return false;
    if (rank() != 0) bytes_ += static_cast<uint64_t>(t.nbytes());
    ShmWork(channel_, t, channel_->stage_reduce(t)).wait();
    return true;
  }
  // symmetric_buffer (symmetric_buffer.h).
  at::Tensor symmetric(int64_t numel, at::ScalarType dtype) {
    auto sym = open_symmetric(*inner_, *store_, key_ + "sym" + std::to_string(symmetric_made_++) + "/", numel,
                              dtype, options_);
    if (!sym) return {};
    std::erase_if(symmetric_, [](const auto& w) { return w.expired(); });
    symmetric_.push_back(sym);
    // The tensor (and its views) own the mapping; the group forgets it once
    // they are gone.
    const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
    count_shm_buffer_bytes(bytes);
    return at::from_blob(
        symmetric_region(*sym), {numel}, [sym, bytes](void*) { count_shm_buffer_bytes(-bytes); },
        at::TensorOptions().dtype(dtype));
  }
  // symmetric_holding (shm_symmetric.h).
  std::shared_ptr<SymmetricSegment> holding(const at::Tensor& t) const {
    for (const auto& weak : symmetric_)
      if (auto sym = weak.lock(); sym && symmetric_holds(*sym, t)) return sym;
    return nullptr;
  }
  // shared_buffer (symmetric_buffer.h).
  at::Tensor shared(int64_t numel, at::ScalarType dtype) {
    return open_shared_region(*inner_, *store_, key_ + "shared" + std::to_string(shared_made_++) + "/", numel,
                              dtype, options_);
  }
  uint64_t bytes_sent() const override { return inner_->bytes_sent() + bytes_.load(); }
  void reset_bytes_sent() override {
    inner_->reset_bytes_sent();
    bytes_.store(0);
  }

 private:
  // A tensor the segment adds in place: contiguous on the CPU, a shm dtype.
  static bool summable(const at::Tensor& t) {
    return shm_dtype(t.scalar_type()) && t.device().is_cpu() && t.is_contiguous();
  }
  // Both tensors non-empty, contiguous on the CPU, in one dtype the segment
  // reduces (anything else, and wrong sizes: the inner group, which checks).
  bool eligible(const at::Tensor& in, const at::Tensor& out) const {
    return shm_dtype(in.scalar_type()) && in.scalar_type() == out.scalar_type() && in.device().is_cpu() &&
           out.device().is_cpu() && in.is_contiguous() && out.is_contiguous() && in.numel() > 0 &&
           out.numel() > 0;
  }

  std::shared_ptr<ShmChannel> channel_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string key_;
  ShmOptions options_;
  std::vector<std::weak_ptr<SymmetricSegment>> symmetric_;
  int symmetric_made_ = 0;  // store keys: one per buffer ever made
  int shared_made_ = 0;
  std::atomic<uint64_t> bytes_{0};
};

}  // namespace

std::shared_ptr<SymmetricSegment> symmetric_holding(Group& g, const at::Tensor& t) {
  auto* shm = dynamic_cast<ShmGroup*>(&g);
  return shm ? shm->holding(t) : nullptr;
}

bool shm_reduce_to_first(Group& g, at::Tensor& t) {
  auto* shm = dynamic_cast<ShmGroup*>(&g);
  return shm != nullptr && shm->reduce_to_first(t);
}

std::unique_ptr<Group> with_shm_collectives(std::unique_ptr<Group> inner,
                                           const c10::intrusive_ptr<c10d::Store>& store,
                                           const std::string& key, const ShmOptions& options) {
  if (inner->size() == 1) return inner;
  std::string why;
  std::unique_ptr<Segment> seg;
  try {
    seg = open_shared(*inner, *store, key, options, why);
  } catch (...) {
    rethrow_comm_error(inner->name(), "setting up the shared-memory collectives");
  }
  // One line per group, from its first member: which path its all-reduces take.
  if (inner->rank() == 0) {
    if (seg)
      DTRAIN_DEBUG("group {} ({} ranks): all_reduce, all_gather and reduce_scatter through shared memory",
                   inner->name(), inner->size());
    else
      DTRAIN_INFO("group {} ({} ranks): collectives over {}: {}", inner->name(), inner->size(),
                  inner->backend(), why);
  }
  if (!seg) return inner;
  auto channel = std::make_shared<ShmChannel>(std::move(seg), inner->name(), inner->size(), inner->rank(), options);
  return std::make_unique<ShmGroup>(std::move(inner), std::move(channel), store, key, options);
}

}  // namespace dtrain::engine::comm::detail

namespace dtrain::engine::comm {

namespace {

// Through the decorators (the trace's) to the shared-memory group, if any;
// with `hier`, stops at a hierarchical group instead (its inner group spans
// nodes: no shared memory there).
Group* shm_group_of(Group& g, bool hier = false) {
  Group* cur = &g;
  for (;;) {
    if (dynamic_cast<detail::ShmGroup*>(cur) || (hier && detail::is_hier_group(*cur))) return cur;
    auto* fwd = dynamic_cast<detail::ForwardingGroup*>(cur);
    if (fwd == nullptr) return nullptr;
    cur = &fwd->inner();
  }
}

}  // namespace

at::Tensor symmetric_buffer(Group& g, int64_t numel, at::ScalarType dtype) {
  if (switched_off("DTRAIN_SYMMETRIC_BUFFERS")) return {};
  Group* found = shm_group_of(g, /*hier=*/true);
  if (found == nullptr) return {};
  if (auto* shm = dynamic_cast<detail::ShmGroup*>(found)) return shm->symmetric(numel, dtype);
  // Across nodes: a symmetric buffer of this node's members (hier_group.h).
  Group* node = detail::hier_node_group(*found);
  return node ? symmetric_buffer(*node, numel, dtype) : at::Tensor();
}

at::Tensor shared_buffer(Group& g, int64_t numel, at::ScalarType dtype) {
  auto* shm = dynamic_cast<detail::ShmGroup*>(shm_group_of(g));
  return shm ? shm->shared(numel, dtype) : at::Tensor();
}

int64_t shm_buffer_bytes() { return detail::counted_shm_buffer_bytes(); }

}  // namespace dtrain::engine::comm
