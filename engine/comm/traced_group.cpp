// CollectiveTrace and the traced Group decorator (traced_group.h). Stores
// into the mapped file are atomic (the agent reads it at any moment); each
// ring record is rewritten between an odd and an even `stamp`.
#include "engine/comm/traced_group.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/log.h"
#include "common/timeline.h"
#include "engine/comm/forwarding_group.h"

namespace dtrain::engine::comm {
namespace {

template <class T, class V>
void store(T& field, V v) {
  __atomic_store_n(&field, static_cast<T>(v), __ATOMIC_RELEASE);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

void copy_name(char* dst, size_t size, const std::string& src) {
  std::memset(dst, 0, size);
  std::memcpy(dst, src.data(), std::min(size - 1, src.size()));
}

uint64_t nbytes(const at::Tensor& t) { return uint64_t(t.numel()) * uint64_t(t.element_size()); }

std::shared_ptr<CollectiveTrace>& the_trace() {
  static std::shared_ptr<CollectiveTrace> trace;
  return trace;
}

}  // namespace

std::shared_ptr<CollectiveTrace> CollectiveTrace::create(const std::string& run_dir, int rank) {
  const std::string path = trace::trace_path(run_dir, rank);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::ftruncate(fd, sizeof(trace::FileLayout)) != 0) {
    DTRAIN_WARN("collective trace {} cannot be written ({}): hangs will not be attributed", path,
                std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, sizeof(trace::FileLayout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    DTRAIN_WARN("collective trace {} cannot be mapped ({})", path, std::strerror(errno));
    return nullptr;
  }
  auto* f = static_cast<trace::FileLayout*>(p);
  std::memset(f, 0, sizeof *f);
  f->version = 1;
  f->rank = rank;
  const double none = std::nan("");
  std::memcpy(&f->loss_bits, &none, sizeof none);
  std::memcpy(f->magic, trace::kMagic, sizeof trace::kMagic);  // last: a reader trusts the rest
  return std::shared_ptr<CollectiveTrace>(new CollectiveTrace(f));
}

CollectiveTrace::~CollectiveTrace() { ::munmap(f_, sizeof(trace::FileLayout)); }

uint32_t CollectiveTrace::slot_of(const std::string& group) {
  for (uint32_t g = 0; g < f_->ngroups; ++g)
    if (std::strncmp(f_->groups[g].name, group.c_str(), sizeof f_->groups[g].name) == 0) return g;
  if (f_->ngroups == trace::kMaxGroups) return trace::kMaxGroups;  // full: not tracked per group
  copy_name(f_->groups[f_->ngroups].name, sizeof f_->groups[0].name, group);
  store(f_->ngroups, f_->ngroups + 1);
  return f_->ngroups - 1;
}

uint64_t CollectiveTrace::enter(const std::string& group, const char* op, uint64_t bytes,
                                bool seq_counted) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t n = f_->entered + 1;
  uint64_t seq = 0;
  if (seq_counted) {
    const uint32_t g = slot_of(group);
    if (g < trace::kMaxGroups) {
      seq = f_->groups[g].entered + 1;
      store(f_->groups[g].entered, seq);
    }
  }
  trace::Record& r = f_->ring[(n - 1) % trace::kRingSize];
  store(r.stamp, 2 * n - 1);
  copy_name(r.group, sizeof r.group, group);
  copy_name(r.op, sizeof r.op, op);
  store(r.seq, seq);
  store(r.bytes, bytes);
  store(r.enter_ns, now_ns());
  store(r.leave_ns, 0);
  store(r.stamp, 2 * n);
  store(f_->entered, n);
  return n;
}

void CollectiveTrace::block(uint64_t n) { store(f_->blocked, n); }

void CollectiveTrace::unblock(uint64_t n, int64_t blocked_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  blocked_ns_ += blocked_ns;
  if (f_->blocked == n) store(f_->blocked, 0);
}

void CollectiveTrace::leave(uint64_t n, int64_t blocked_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  blocked_ns_ += blocked_ns;
  if (f_->blocked == n) store(f_->blocked, 0);
  trace::Record& r = f_->ring[(n - 1) % trace::kRingSize];
  if (r.stamp == 2 * n) {  // not yet overwritten by a newer collective
    store(r.stamp, 2 * n + 1);
    store(r.leave_ns, now_ns());
    store(r.stamp, 2 * n);
    for (uint32_t g = 0; g < f_->ngroups && r.seq > 0; ++g)
      if (std::strncmp(f_->groups[g].name, r.group, sizeof r.group) == 0 &&
          f_->groups[g].completed < r.seq)
        store(f_->groups[g].completed, r.seq);
  }
  store(f_->completed, f_->completed + 1);
}

void CollectiveTrace::set_step(int64_t step) {
  if (f_->first_step_ns == 0) store(f_->first_step_ns, now_ns());  // start-up ends here
  store(f_->step, step);
}
void CollectiveTrace::set_run_start(int64_t start_step, int64_t tokens_per_step) {
  store(f_->start_step, start_step);
  store(f_->done_step, start_step);
  store(f_->tokens_per_step, tokens_per_step);
}
void CollectiveTrace::step_done(int64_t step, int64_t step_ns) {
  store(f_->step_ns, f_->step_ns + step_ns);
  store(f_->last_step_ns, step_ns);
  store(f_->done_step, step);  // last: a reader that sees the step sees its time
}
void CollectiveTrace::add_checkpoint_ns(int64_t ns) { store(f_->checkpoint_ns, f_->checkpoint_ns + ns); }
void CollectiveTrace::set_logged(double loss, double straggler_ratio) {
  uint64_t bits;
  std::memcpy(&bits, &straggler_ratio, sizeof bits);
  store(f_->straggler_bits, bits);
  std::memcpy(&bits, &loss, sizeof bits);
  store(f_->loss_bits, bits);
}
void CollectiveTrace::set_phase(trace::Phase phase) { store(f_->phase, static_cast<uint32_t>(phase)); }
int64_t CollectiveTrace::blocked_ns() const {
  std::lock_guard<std::mutex> lock(mu_);
  return blocked_ns_;
}

void set_process_trace(std::shared_ptr<CollectiveTrace> trace) { the_trace() = std::move(trace); }
CollectiveTrace* process_trace() { return the_trace().get(); }
void trace_step(int64_t step) {
  if (auto* t = process_trace()) t->set_step(step);
}
void trace_phase(trace::Phase phase) {
  if (auto* t = process_trace()) t->set_phase(phase);
}
void trace_run_start(int64_t start_step, int64_t tokens_per_step) {
  if (auto* t = process_trace()) t->set_run_start(start_step, tokens_per_step);
}
void trace_step_done(int64_t step, double step_s) {
  if (auto* t = process_trace()) t->step_done(step, int64_t(step_s * 1e9));
}
void trace_checkpoint_s(double seconds) {
  if (auto* t = process_trace()) t->add_checkpoint_ns(int64_t(seconds * 1e9));
}
void trace_logged(double loss, double straggler_ratio) {
  if (auto* t = process_trace()) t->set_logged(loss, straggler_ratio);
}
int64_t trace_blocked_ns() {
  auto* t = process_trace();
  return t ? t->blocked_ns() : 0;
}

namespace {

// An async op's handle: leaves the trace when wait() first returns (or, if
// nobody waits, when it is dropped).
// The timeline span of an async op runs from its launch to its wait()'s
// return; its wait time is the launch's blocked time plus the wait's.
struct TimelineOp {
  const char* op;
  const std::string* group;
  uint64_t bytes;
  int64_t launched_ns;  // steady clock
  int64_t blocked_ns;   // in the launch
};

class TracedWork : public Work {
 public:
  TracedWork(WorkPtr inner, std::shared_ptr<CollectiveTrace> trace, uint64_t n, TimelineOp span)
      : inner_(std::move(inner)), trace_(std::move(trace)), n_(n), span_(span) {}
  ~TracedWork() override {
    if (!left_) {
      trace_->leave(n_, 0);
      timeline::record_collective(span_.op, *span_.group, span_.bytes, span_.launched_ns, span_.blocked_ns);
    }
  }
  void wait() override {
    const int64_t start = mono_ns();
    if (!left_) trace_->block(n_);
    inner_->wait();
    if (!left_) {
      left_ = true;
      const int64_t waited = mono_ns() - start;
      trace_->leave(n_, waited);
      timeline::record_collective(span_.op, *span_.group, span_.bytes, span_.launched_ns, span_.blocked_ns + waited);
    }
  }

 private:
  WorkPtr inner_;
  std::shared_ptr<CollectiveTrace> trace_;
  uint64_t n_;
  TimelineOp span_;
  bool left_ = false;
};

class TracedGroup : public detail::ForwardingGroup {
 public:
  TracedGroup(std::unique_ptr<Group> inner, std::shared_ptr<CollectiveTrace> trace)
      : ForwardingGroup(std::move(inner)), trace_(std::move(trace)) {}

  WorkPtr all_reduce(at::Tensor& t, bool async, ReduceOp op) override {
    return run("all_reduce", nbytes(t), async, true, [&] { return inner_->all_reduce(t, async, op); });
  }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out, bool async) override {
    return run("all_gather", nbytes(out), async, true, [&] { return inner_->all_gather(in, out, async); });
  }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, bool async) override {
    return run("reduce_scatter", nbytes(in), async, true,
               [&] { return inner_->reduce_scatter(in, out, async); });
  }
  WorkPtr broadcast(at::Tensor& t, int root, bool async) override {
    return run("broadcast", nbytes(t), async, true, [&] { return inner_->broadcast(t, root, async); });
  }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits, bool async) override {
    return run("all_to_all", nbytes(in), async, true,
               [&] { return inner_->all_to_all(in, out, out_splits, in_splits, async); });
  }
  WorkPtr send(const at::Tensor& t, int peer, int tag) override {
    return run("send", nbytes(t), true, false, [&] { return inner_->send(t, peer, tag); });
  }
  WorkPtr recv(at::Tensor& t, int peer, int tag) override {
    return run("recv", nbytes(t), true, false, [&] { return inner_->recv(t, peer, tag); });
  }
  void barrier() override {
    run("barrier", 0, false, true, [&] {
      inner_->barrier();
      return WorkPtr();
    });
  }
 private:
  template <class Op>
  WorkPtr run(const char* op, uint64_t bytes, bool async, bool counted, Op&& call) {
    const uint64_t n = trace_->enter(name(), op, bytes, counted);
    const int64_t start = mono_ns();
    // A blocking call waits from the start; so may an async one's launch
    // (a shared-memory all-reduce whose staging set is still being read).
    trace_->block(n);
    WorkPtr work;
    try {
      work = call();
    } catch (...) {
      trace_->leave(n, mono_ns() - start);
      throw;
    }
    const int64_t blocked = mono_ns() - start;
    if (async) {
      trace_->unblock(n, blocked);
      return std::make_shared<TracedWork>(std::move(work), trace_, n, TimelineOp{op, &name(), bytes, start, blocked});
    }
    trace_->leave(n, blocked);
    timeline::record_collective(op, name(), bytes, start, blocked);
    return work;
  }

  std::shared_ptr<CollectiveTrace> trace_;
};

}  // namespace

std::unique_ptr<Group> traced(std::unique_ptr<Group> inner, std::shared_ptr<CollectiveTrace> trace) {
  if (!trace || !inner) return inner;
  return std::make_unique<TracedGroup>(std::move(inner), std::move(trace));
}

}  // namespace dtrain::engine::comm
