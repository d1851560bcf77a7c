// HostUpdate (host_update.h). Under a GPU two copy streams from the pool,
// one per direction, so a bucket's gradients come down while the previous
// bucket's parameters go up (PCIe carries both at once). Ordering, all of
// it by stream order and events, none by waiting on the device:
//   - the gradients are read after the backward: the down stream waits for
//     an event recorded on the caller's stream when step() starts;
//   - staging_[b % 2] is refilled (bucket b + 2) only after the CPU updated
//     b from it, as the loop is sequential;
//   - the master of b is written by the next step only after the up stream
//     copied it: the caller's stream waits for the up stream at the end of
//     this step, the next step's down stream waits for the caller's, and the
//     CPU waits for the down stream before it updates.
// On a CPU (the test override) every copy is a synchronous memcpy in that
// same order.
#include "engine/optim/host_update.h"

#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "common/error.h"

namespace dtrain::engine::optim {

struct HostUpdate::Streams {
  explicit Streams(c10::Device d)
      : device(d),
        impl(d.type()),
        down(impl.getStreamFromGlobalPool(d, false)),
        up(impl.getStreamFromGlobalPool(d, false)),
        ready(d.type()),
        grads0(d.type()),
        grads1(d.type()),
        done(d.type()) {}
  c10::Device device;
  c10::impl::VirtualGuardImpl impl;
  c10::Stream down, up;  // gradients to the host; parameters to the device
  c10::Event ready;      // the caller's stream at the step's start
  c10::Event grads0, grads1;  // staging_[0], staging_[1] filled
  c10::Event done;       // the last copy back
  c10::Event& grads(int b) { return b % 2 ? grads1 : grads0; }
};

// A fork-join crew of n - 1 threads that live as long as the HostUpdate:
// run(job) calls job(t) for t = 0..n-1, t = 0 on the caller, and returns
// when all are done. ATen's intra-op pool is not used: the worker keeps it at
// one thread (ranks are the parallelism on a CPU), and widening it would
// widen every CPU op of the rank, not this update alone.
class HostUpdate::Crew {
 public:
  explicit Crew(int n) {
    for (int t = 1; t < n; ++t) threads_.emplace_back([this, t] { serve(t); });
  }
  ~Crew() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& th : threads_) th.join();
  }
  int size() const { return int(threads_.size()) + 1; }
  // job must not throw: it runs plain loops over memory.
  void run(const std::function<void(int)>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      pending_ = int(threads_.size());
      ++round_;
    }
    wake_.notify_all();
    job(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void serve(int t) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || round_ != seen; });
        if (stop_) return;
        seen = round_;
        job = job_;
      }
      (*job)(t);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t round_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

HostUpdate::HostUpdate(const OffloadStore& store, const std::vector<at::Tensor>& params, bool pinned,
                       bool no_copy_back, int threads)
    : no_copy_back_(no_copy_back) {
  if (threads > 1) crew_ = std::make_unique<Crew>(threads);
  int64_t total = 0;
  for (const auto& p : params) {
    if (p.device() != params.front().device())
      throw Error(ErrorCode::internal, "HostUpdate: parameters on more than one device");
    first_.push_back(total);
    total += p.numel();
  }
  version_.assign(params.size(), -1);  // the first step reads every parameter
  const auto host = at::TensorOptions().dtype(at::kFloat).pinned_memory(pinned);
  master_ = at::empty({std::max<int64_t>(1, total)}, host);
  int64_t most = 1;
  for (int b = 0; b < store.buckets(); ++b) most = std::max(most, store.bucket_len(b));
  for (auto& s : staging_) s = at::empty({most}, host);
  if (!params.empty() && !params.front().device().is_cpu())
    streams_ = std::make_unique<Streams>(params.front().device());
}

HostUpdate::~HostUpdate() = default;

int64_t HostUpdate::bytes() const {
  return 4 * (master_.numel() + staging_[0].numel() + staging_[1].numel());
}

// Parameters written since the master last matched them (their version
// counter moved: initialisation, a checkpoint load, an all-gather into the
// flat buffer they are views of) are read into the master, synchronously.
void HostUpdate::refresh_master(std::vector<at::Tensor>& params, const StepArgs& args) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i]._version() == version_[i]) continue;
    args.page(int64_t(i));
    master_.narrow(0, first_[i], params[i].numel()).copy_(params[i].reshape({-1}));
  }
  args.page(-1);
}

OffloadIo HostUpdate::take_stats() {
  OffloadIo out{double(copy_ns_) * 1e-9, double(wait_ns_) * 1e-9, double(update_ns_) * 1e-9};
  copy_ns_ = wait_ns_ = update_ns_ = 0;
  return out;
}

void HostUpdate::grads_in(const OffloadStore& store, int b, const StepArgs& args) {
  const int64_t t0 = offload_now_ns();
  std::optional<c10::StreamGuard> on;
  if (streams_) on.emplace(streams_->down);
  for (const auto& pc : store.pieces(b)) {
    const at::Tensor g = args.grad(pc.param);
    if (!g.defined()) continue;
    staging_[b % 2].narrow(0, pc.at, pc.end - pc.begin).copy_(g.reshape({-1}).slice(0, pc.begin, pc.end), true);
  }
  if (streams_) streams_->grads(b).record(streams_->down);
  copy_ns_ += offload_now_ns() - t0;
}

void HostUpdate::wait_grads(int b) {
  if (!streams_) return;
  const int64_t t0 = offload_now_ns();
  streams_->grads(b).synchronize();
  wait_ns_ += offload_now_ns() - t0;
}

void HostUpdate::step(OffloadStore& store, std::vector<at::Tensor>& params, const StepArgs& args) {
  refresh_master(params, args);
  const int nb = store.buckets();
  if (streams_) {
    streams_->ready.record(streams_->impl.getStream(streams_->device));
    streams_->ready.block(streams_->down);
  }
  if (nb > 0) grads_in(store, 0, args);
  float* master = master_.data_ptr<float>();
  for (int b = 0; b < nb; ++b) {
    if (b + 1 < nb) grads_in(store, b + 1, args);
    wait_grads(b);
    float* m = store.acquire(b);
    float* v = m + store.bucket_len(b);
    const float* g = staging_[b % 2].const_data_ptr<float>();
    const int64_t t0 = offload_now_ns();
    if (!crew_) {
      for (const auto& pc : store.pieces(b))
        if (args.grad(pc.param).defined())
          kernel::adamw_run(master + first_[pc.param] + pc.begin, g + pc.at, m + pc.at, v + pc.at,
                            pc.end - pc.begin, args.scalars(pc.param));
    } else {
      // The pieces to update and their constants, read on this thread (the
      // callbacks touch tensors); the crew then splits the bucket's elements
      // [0, len) into equal ranges and updates each piece's overlap with its own.
      struct Run {
        int64_t at, len;
        float* p;
        kernel::AdamWScalars c;
      };
      std::vector<Run> runs;
      for (const auto& pc : store.pieces(b))
        if (args.grad(pc.param).defined())
          runs.push_back({pc.at, pc.end - pc.begin, master + first_[pc.param] + pc.begin, args.scalars(pc.param)});
      const int64_t len = store.bucket_len(b);
      const int n = crew_->size();
      crew_->run([&](int t) {
        const int64_t lo = len * t / n, hi = len * (t + 1) / n;
        for (const Run& r : runs) {
          const int64_t a = std::max(lo, r.at), e = std::min(hi, r.at + r.len);
          if (a < e) kernel::adamw_run(r.p + (a - r.at), g + a, m + a, v + a, e - a, r.c);
        }
      });
    }
    update_ns_ += offload_now_ns() - t0;
    store.release(b);
    if (no_copy_back_) continue;
    std::optional<c10::StreamGuard> on;
    if (streams_) on.emplace(streams_->up);
    for (const auto& pc : store.pieces(b)) {
      if (!args.grad(pc.param).defined()) continue;
      args.page(int64_t(pc.param));  // a paged parameter (ZeRO-3's on file) is written while in memory
      const int64_t t1 = offload_now_ns();  // the copy alone: paging is the parameters' offload's to count
      params[pc.param].view({-1}).slice(0, pc.begin, pc.end).copy_(
          master_.narrow(0, first_[pc.param] + pc.begin, pc.end - pc.begin), true);
      copy_ns_ += offload_now_ns() - t1;
    }
  }
  args.page(-1);
  if (streams_) {
    streams_->done.record(streams_->up);
    streams_->done.block(streams_->impl.getStream(streams_->device));
  }
  // After every copy back: views of one flat buffer share one counter.
  for (size_t i = 0; i < params.size(); ++i) version_[i] = params[i]._version();
}

}  // namespace dtrain::engine::optim
