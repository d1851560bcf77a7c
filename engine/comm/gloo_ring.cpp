// Ring reduce-scatter over Gloo send/recv (Gloo in LibTorch 1.13 has none),
// and the TaskThread that runs it in the background. Bandwidth-optimal like
// NCCL's: n-1 steps, each rank sends one chunk right and receives one from the
// left, so it sends (n-1)/n of the input. Chunks may be uneven or empty.
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/comm/gloo_group.h"

namespace dtrain::engine::comm::detail {

// ---- TaskThread ----

TaskThread::~TaskThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_future<void> TaskThread::submit(std::function<void()> fn) {
  std::packaged_task<void()> task(std::move(fn));
  std::shared_future<void> fut = task.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
  return fut;
}

void TaskThread::drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
  }
  submit([] {}).wait();
}

void TaskThread::loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // exceptions land in the task's future
  }
}

// ---- the ring ----

namespace {

class FutureWork : public Work {
 public:
  FutureWork(std::shared_future<void> fut, std::function<void()> finish)
      : fut_(std::move(fut)), finish_(std::move(finish)) {}

  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    fut_.get();  // rethrows the task's dtrain::Error
    if (finish_) finish_();
  }

 private:
  std::mutex mu_;
  bool done_ = false;
  std::shared_future<void> fut_;
  std::function<void()> finish_;
};

constexpr int kRingTagBase = 1 << 30;  // above kMaxUserTag, below Gloo's collective slots
constexpr int kRingTagBits = 26;       // per-slot window; 8 slots fit below 2^31
// Each ring step of a chunk travels in segments of about this size, so that
// a rank forwards segment k while segment k+1 is still on the wire.
constexpr int64_t kRingSegmentBytes = 256 << 10;
// Segments per step at most (a bigger chunk gets bigger segments). Each
// (seq, step) owns this many consecutive tags, one per segment.
constexpr int kRingMaxSegments = 256;

}  // namespace

// Tags of op `seq`, step `step`: [tag, tag + kRingMaxSegments). Windows of
// different (seq, step) are disjoint until 2^18 / n ops later (mod wrap).
int GlooGroup::ring_tag(uint32_t seq, int step) const {
  constexpr uint32_t kWindows = (1u << kRingTagBits) / kRingMaxSegments;
  uint32_t window = (seq * static_cast<uint32_t>(size()) + static_cast<uint32_t>(step)) % kWindows;
  return kRingTagBase + (slot_ << kRingTagBits) + static_cast<int>(window) * kRingMaxSegments;
}

// in: [n*m] flat, out: [m], chunk i = in[i*m, (i+1)*m). Rank r ends with
// out = sum over ranks of their chunk r.
// Step s (0..n-2): send chunk (r-s-1) (own data at s=0, then the partial sum
// just accumulated) to r+1; receive chunk (r-s-2) from r-1 and add own data.
// The last received chunk is (r-n) mod n = r. Two buffers alternate: the one
// received at step s is sent at step s+1 while the other receives.
// Pipelined by segment: each chunk is cut into segments [seg] and (s, k) is
// handled as soon as segment k of step s arrives: add, post its send for step
// s+1, then (once send (s, k) is done, which read that memory) post recv
// (s+1, k). Every rank handles (s, k) in the same lexicographic order and
// (s, k) only waits on (s-1, k) of its neighbours, so it cannot deadlock.
// The additions happen in the same order as unsegmented: results are the same.
void GlooGroup::ring_reduce_scatter(const at::Tensor& in, at::Tensor& out, uint32_t seq) {
  const int n = size(), r = rank_;
  const int64_t m = out.numel();
  if (m == 0) return;  // every chunk has m elements: every rank skips alike
  const int64_t seg = std::max<int64_t>(kRingSegmentBytes / in.element_size(),
                                        (m + kRingMaxSegments - 1) / kRingMaxSegments);
  const int nseg = static_cast<int>((m + seg - 1) / seg);
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  auto part = [&](const at::Tensor& t, int64_t off, int k) {  // [<= seg]
    return t.narrow(0, off + k * seg, std::min(seg, m - k * seg));
  };
  at::Tensor buf[2] = {at::empty({m}, in.options()), at::empty({m}, in.options())};  // [m]
  const int right = mod(r + 1), left = mod(r - 1);
  const uint64_t elem = static_cast<uint64_t>(in.element_size());
  // sends[k] / recvs[k]: the in-flight send / recv of segment k.
  std::vector<c10::intrusive_ptr<c10d::Work>> sends(nseg), recvs(nseg);
  auto post_recv = [&](int s, int k) {
    std::vector<at::Tensor> v{part(buf[s % 2], 0, k)};
    recvs[k] = pg_->recv(v, left, ring_tag(seq, s) + k);
  };
  auto post_send = [&](int s, int k) {
    std::vector<at::Tensor> v{s == 0 ? part(in, mod(r - 1) * m, k) : part(buf[(s - 1) % 2], 0, k)};
    sends[k] = pg_->send(v, right, ring_tag(seq, s) + k);
    bytes_ += static_cast<uint64_t>(v[0].numel()) * elem;
  };
  int s = 0;
  try {
    for (int k = 0; k < nseg; ++k) post_recv(0, k);
    for (int k = 0; k < nseg; ++k) post_send(0, k);
    for (; s < n - 1; ++s) {
      const int64_t rc = mod(r - s - 2) * m;  // own chunk added at step s
      for (int k = 0; k < nseg; ++k) {
        recvs[k]->wait();
        at::Tensor got = part(buf[s % 2], 0, k);
        if (s == n - 2) {
          at::Tensor dst = part(out, 0, k);
          at::add_out(dst, got, part(in, rc, k));
          sends[k]->wait();
          continue;
        }
        got.add_(part(in, rc, k));
        auto done = std::move(sends[k]);
        post_send(s + 1, k);
        done->wait();  // it read buf[(s+1)%2] segment k, which recv (s+1, k) overwrites
        post_recv(s + 1, k);
      }
    }
  } catch (...) {
    rethrow_comm_error(name_, "reduce_scatter (ring step " + std::to_string(s) + ")");
  }
}

WorkPtr GlooGroup::reduce_scatter(const at::Tensor& in, at::Tensor& out, bool async) {
  check(in, "reduce_scatter");
  check(out, "reduce_scatter");
  const int n = size();
  if (in.numel() != n * out.numel() || in.scalar_type() != out.scalar_type())
    throw Error(ErrorCode::internal, "reduce_scatter on group " + name_ + ": in has " +
                                         std::to_string(in.numel()) + " elements, expected " +
                                         std::to_string(n) + " x " +
                                         std::to_string(out.numel()));
  if (n == 1) {
    out.view({-1}).copy_(in.reshape({-1}));
    return std::make_shared<FutureWork>(ring_thread_.submit([] {}), nullptr);
  }
  const bool bf16 = in.scalar_type() == at::kBFloat16;
  // The ring works on flat tensors; bf16 travels (and adds) as fp32.
  at::Tensor in_w = bf16 ? in.reshape({-1}).to(at::kFloat) : in.reshape({-1});  // [n*m]
  at::Tensor out_w = bf16 ? at::empty({out.numel()}, in_w.options()) : out.view({-1});  // [m]
  if (native_reduce_scatter_) {
    // Gloo's own reduce-scatter (LibTorch 2.x), for comparison with the ring:
    // cluster.gloo_reduce_scatter native (CommOptions::gloo_native_reduce_scatter).
    bytes_ += static_cast<uint64_t>((n - 1) * in_w.nbytes() / n);
    std::function<void()> copy_back;
    if (bf16) copy_back = [out, out_w]() mutable { out.view({-1}).copy_(out_w); };
    try {
      return gloo_work(pg_->_reduce_scatter_base(out_w, in_w), std::move(copy_back),
                       "reduce_scatter", async);
    } catch (...) {
      rethrow_comm_error(name_, "reduce_scatter");
    }
  }
  const uint32_t seq = ring_seq_++;
  auto fut = ring_thread_.submit([this, in_w, out_w, seq]() mutable {
    ring_reduce_scatter(in_w, out_w, seq);
  });
  std::function<void()> finish;
  if (bf16) finish = [out, out_w]() mutable { out.view({-1}).copy_(out_w); };
  auto w = std::make_shared<FutureWork>(fut, std::move(finish));
  if (!async) w->wait();
  return w;
}

}  // namespace dtrain::engine::comm::detail
