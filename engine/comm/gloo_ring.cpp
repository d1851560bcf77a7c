// Ring reduce-scatter over Gloo send/recv (Gloo in LibTorch 1.13 has none),
// and the TaskThread that runs it in the background. Bandwidth-optimal like
// NCCL's: n-1 steps, each rank sends one chunk right and receives one from the
// left, so it sends (n-1)/n of the input. Chunks may be uneven or empty.
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>

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

}  // namespace

int GlooGroup::ring_tag(uint32_t seq, int step) const {
  uint32_t window = (seq * static_cast<uint32_t>(size()) + static_cast<uint32_t>(step)) &
                    ((1u << kRingTagBits) - 1);
  return kRingTagBase + (slot_ << kRingTagBits) + static_cast<int>(window);
}

// in: [n*m] flat, out: [m], chunk i = in[i*m, (i+1)*m). Rank r ends with
// out = sum over ranks of their chunk r.
// Step s (0..n-2): send chunk (r-s-1) (own data at s=0, then the partial sum
// just accumulated) to r+1; receive chunk (r-s-2) from r-1 and add own data.
// The last received chunk is (r-n) mod n = r. Two buffers alternate: the one
// received at step s is sent at step s+1 while the other receives.
void GlooGroup::ring_reduce_scatter(const at::Tensor& in, at::Tensor& out, uint32_t seq) {
  const int n = size(), r = rank_;
  const int64_t m = out.numel();
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  auto chunk = [&](int i) { return in.narrow(0, i * m, m); };  // [m]
  at::Tensor buf[2] = {at::empty({m}, in.options()), at::empty({m}, in.options())};
  const int right = mod(r + 1), left = mod(r - 1);
  for (int s = 0; s < n - 1; ++s) {
    const int sc = mod(r - s - 1), rc = mod(r - s - 2);
    std::vector<at::Tensor> send_v{s == 0 ? chunk(sc) : buf[(s - 1) % 2]};
    std::vector<at::Tensor> recv_v{buf[s % 2]};
    const int tag = ring_tag(seq, s);
    c10::intrusive_ptr<c10d::Work> rw, sw;
    try {
      if (m > 0) {  // every chunk has m elements: both sides skip empty ones alike
        rw = pg_->recv(recv_v, left, tag);
        sw = pg_->send(send_v, right, tag);
        sw->wait();
        rw->wait();
      }
    } catch (...) {
      rethrow_comm_error(name_, "reduce_scatter (ring step " + std::to_string(s) + ")");
    }
    bytes_ += static_cast<uint64_t>(m * in.element_size());
    if (s == n - 2) at::add_out(out, recv_v[0], chunk(rc));
    else recv_v[0].add_(chunk(rc));
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
