// DDP buckets and gradient hooks (see ddp.h). A post-hook on every
// parameter's AccumulateGrad node counts down its bucket; full buckets are
// launched strictly in bucket order (every rank issues the same collectives
// in the same order, as c10d's Reducer does). An end-of-backward callback
// launches buckets whose params got no grad. Not thread-safe by design: CPU
// autograd runs hooks and callbacks on the thread that called backward().
#include "engine/parallel/ddp/ddp.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <string>
#include <utility>
#include <chrono>

#include "common/error.h"
#include "common/log.h"

namespace dtrain::engine::parallel {
namespace detail {

struct Bucket {
  at::Tensor flat;               // [numel] fp32; the grads of `params` are views into it
  std::vector<int> params;       // indices into DdpState::params, in bucket order
  std::vector<int64_t> offsets;  // element offset of each param in `flat`
  at::Tensor wire;               // [numel] bf16: what is all-reduced (parallel.reduce_dtype bf16)
  int pending = 0;               // grads of this bucket not yet ready in this backward
  bool launched = false;
  comm::WorkPtr work;
};

struct DdpState : std::enable_shared_from_this<DdpState> {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;  // registration order
  std::vector<int> bucket_of;      // param index -> bucket index
  std::vector<Bucket> buckets;     // bucket 0 holds the LAST registered params
  comm::Group* dp = nullptr;
  DdpOptions options;
  bool sync = true;
  bool callback_queued = false;
  size_t next_to_launch = 0;  // buckets launch in index order only
  int launched_in_backward = 0;
  // The hooks hang off these nodes; a param's accumulator is only weakly
  // referenced by the param, so without these the hooks would vanish.
  // (shared_ptr in LibTorch 2.11, intrusive_ptr in later versions)
  using AccumulatorPtr =
      decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  std::vector<AccumulatorPtr> accumulators;

  void launch(size_t b) {
    Bucket& bucket = buckets[b];
    // fault.kind no_grad_sync (the parity tests' negative control): every
    // rank still issues the same all-reduces, but of a copy, so each trains
    // on its own unsynchronised gradient.
    at::Tensor target = options.fault_no_grad_sync ? bucket.flat.clone() : bucket.flat;
    // reduce_dtype bf16: half the bytes on the wire; the sum comes back
    // into the fp32 bucket after the wait (finish_gradient_sync).
    if (options.reduce_bf16) target = bucket.wire = target.to(at::kBFloat16);
    bucket.work = dp->all_reduce(target, /*async=*/true);
    bucket.launched = true;
  }

  void launch_ready_in_order() {
    while (next_to_launch < buckets.size() && buckets[next_to_launch].pending == 0) {
      launch(next_to_launch++);
      ++launched_in_backward;
    }
  }

  void launch_rest() {
    while (next_to_launch < buckets.size()) launch(next_to_launch++);
  }

  void on_grad_ready(int param);
  void reset_for_next_step() {
    for (auto& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.launched = false;
      b.work.reset();
    }
    next_to_launch = 0;
    launched_in_backward = 0;
    callback_queued = false;
  }
};

// Fires after AccumulateGrad has added this backward's gradient into the
// param's grad (a view into its bucket).
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::weak_ptr<DdpState> state, int param) : state_(std::move(state)), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto s = state_.lock()) s->on_grad_ready(param_);
    return outputs;
  }

 private:
  std::weak_ptr<DdpState> state_;
  int param_;
};

void DdpState::on_grad_ready(int param) {
  if (!sync || !options.overlap) return;  // no_sync micro-step, or all-reduce after backward
  if (!callback_queued) {
    // Buckets holding params that got no grad this backward never count
    // down to zero: launch them once the whole backward is done.
    callback_queued = true;
    std::weak_ptr<DdpState> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto s = weak.lock()) s->launch_rest();
    });
  }
  Bucket& bucket = buckets[bucket_of[param]];
  if (--bucket.pending == 0) launch_ready_in_order();
}

}  // namespace detail

namespace {

void check_param(const std::string& name, const at::Tensor& p, const comm::Group& dp) {
  if (p.scalar_type() != at::kFloat || p.device() != dp.device() || !p.is_contiguous() ||
      !p.requires_grad())
    throw Error(ErrorCode::internal,
                "DDP: parameter " + name + " is not a contiguous fp32 tensor on " +
                    dp.device().str() + " requiring grad (it is on " + p.device().str() + ")",
                "DDP buckets hold fp32 grads on the dp group's device; keep parameters in that form");
}

}  // namespace

Ddp::Ddp(std::vector<std::pair<std::string, at::Tensor>> named_params, comm::Group& dp,
         DdpOptions options)
    : state_(std::make_shared<detail::DdpState>()) {
  auto& s = *state_;
  s.dp = &dp;
  s.options = options;
  for (auto& [name, p] : named_params) {
    check_param(name, p, dp);
    s.names.push_back(name);
    s.params.push_back(p);
  }
  const int n = static_cast<int>(s.params.size());
  s.bucket_of.assign(n, -1);

  // Reverse registration order approximates the order backward produces
  // grads (the head's first, the embeddings' last).
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(options.bucket_mb * 1024 * 1024));
  std::vector<std::vector<int>> groups(1);
  int64_t bytes = 0;
  for (int i = n - 1; i >= 0; --i) {
    if (bytes >= cap) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += s.params[i].numel() * 4;
  }
  for (auto& g : groups) {
    if (g.empty()) continue;
    detail::Bucket b;
    int64_t numel = 0;
    for (int i : g) {
      b.params.push_back(i);
      b.offsets.push_back(numel);
      numel += s.params[i].numel();
    }
    b.flat = at::zeros({numel}, s.params[g[0]].options().requires_grad(false));
    s.buckets.push_back(std::move(b));
  }

  at::NoGradGuard no_grad;
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    auto& bucket = s.buckets[b];
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      int i = bucket.params[k];
      at::Tensor& p = s.params[i];
      at::Tensor slot = bucket.flat.narrow(0, bucket.offsets[k], p.numel());
      s.bucket_of[i] = static_cast<int>(b);
      // Initial parameters from dp rank 0: pack into the (still unused)
      // bucket, broadcast, unpack.
      slot.copy_(p.reshape({-1}));
    }
    if (dp.size() > 1) dp.broadcast(bucket.flat, /*root=*/0)->wait();
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      at::Tensor& p = s.params[bucket.params[k]];
      at::Tensor slot = bucket.flat.narrow(0, bucket.offsets[k], p.numel());
      p.copy_(slot.view(p.sizes()));
      p.mutable_grad() = slot.view(p.sizes());  // [param shape] view into the bucket
    }
    bucket.flat.zero_();
  }

  if (dp.size() > 1) {
    for (int i = 0; i < n; ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(s.params[i]);
      acc->add_post_hook(std::make_unique<detail::GradReadyHook>(state_, i));
      s.accumulators.push_back(std::move(acc));
    }
  }
  s.reset_for_next_step();
  DTRAIN_DEBUG("ddp: {} params in {} buckets of up to {} MB, overlap {}", n, s.buckets.size(),
               options.bucket_mb, options.overlap);
}

Ddp::~Ddp() = default;

void Ddp::set_grad_sync(bool enabled) { state_->sync = enabled; }
bool Ddp::grad_sync() const { return state_->sync; }

DdpSyncStats Ddp::finish_gradient_sync() {
  auto& s = *state_;
  DdpSyncStats stats;
  stats.buckets = static_cast<int>(s.buckets.size());
  if (s.dp->size() == 1) return stats;
  auto t0 = std::chrono::steady_clock::now();
  s.launch_rest();  // with overlap on: only buckets no hook completed
  for (auto& b : s.buckets) {
    b.work->wait();
    if (b.wire.defined()) {
      if (!s.options.fault_no_grad_sync) b.flat.copy_(b.wire);
      b.wire.reset();
    }
  }
  stats.wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats.launched_in_backward = s.launched_in_backward;

  // The grads must still be the views set up at construction; someone who
  // replaced one (set it undefined, assigned a new tensor) would silently
  // train on an unreduced gradient.
  for (size_t b = 0; b < s.buckets.size(); ++b)
    for (size_t k = 0; k < s.buckets[b].params.size(); ++k) {
      int i = s.buckets[b].params[k];
      const at::Tensor& g = s.params[i].grad();
      if (!g.defined() ||
          g.data_ptr() != static_cast<void*>(s.buckets[b].flat.data_ptr<float>() +
                                             s.buckets[b].offsets[k]))
        throw Error(ErrorCode::internal,
                    "DDP: the grad of " + s.names[i] + " is no longer a view into its bucket",
                    "zero grads in place (Ddp::zero_grad), never reset or reassign them");
    }
  s.reset_for_next_step();
  return stats;
}

void Ddp::zero_grad() {
  for (auto& b : state_->buckets) b.flat.zero_();
}

std::vector<at::Tensor> Ddp::flat_grads() const {
  std::vector<at::Tensor> out;
  for (auto& b : state_->buckets) out.push_back(b.flat);
  return out;
}

int Ddp::num_buckets() const { return static_cast<int>(state_->buckets.size()); }

int64_t Ddp::grad_bytes() const {
  int64_t bytes = 0;
  for (auto& b : state_->buckets) bytes += b.flat.numel() * b.flat.element_size();
  return bytes;
}

std::vector<std::string> Ddp::bucket_params(int i) const {
  std::vector<std::string> out;
  for (int p : state_->buckets.at(i).params) out.push_back(state_->names[p]);
  return out;
}

}  // namespace dtrain::engine::parallel
