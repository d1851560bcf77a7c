// DDP buckets (see ddp.h). The backward hooks are bucket_hooks.h's (shared
// with ZeRO): full buckets are launched strictly in bucket order (every rank
// issues the same collectives in the same order, as c10d's Reducer does), and
// an end-of-backward callback launches buckets whose params got no grad.
#include "engine/parallel/ddp/ddp.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "engine/comm/symmetric_buffer.h"
#include "engine/model/grad_slot.h"
#include "engine/parallel/bucket_hooks.h"

namespace dtrain::engine::parallel {
namespace detail {

struct Bucket {
  at::Tensor flat;               // [numel] fp32; the grads of `params` are views into it
  std::vector<int> params;       // indices into DdpState::params, in bucket order
  std::vector<int64_t> offsets;  // element offset of each param in `flat`
  at::Tensor wire;               // [numel] bf16: what is all-reduced (parallel.reduce_dtype bf16)
  comm::WorkPtr work;
};

struct DdpState {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;  // registration order
  std::vector<int> bucket_of;      // param index -> bucket index
  std::vector<int64_t> offset_of;  // param index -> element offset in its bucket
  std::vector<Bucket> buckets;     // bucket 0 holds the LAST registered params
  comm::Group* dp = nullptr;
  DdpOptions options;
  bool symmetric = false;  // the buckets are views into the dp group's symmetric buffer
  bool sync = true;
  BucketHooks hooks;  // launches bucket b from backward, buckets in index order

  // After zero_grad() the grads are unset, so the step's first backward
  // hands each its gradient tensor as it is (AccumulateGrad steals it: no
  // zero fill, no add); a post-hook, ahead of the bucket hooks, copies it
  // into the slot and makes the grad the slot view again. Params that got
  // no gradient get a zeroed slot at the end of that backward.
  std::vector<bool> unset;
  bool settle_queued = false;
  std::weak_ptr<DdpState> self;
  using AccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  std::vector<AccumulatorPtr> accumulators;  // the settle hooks hang off these

  at::Tensor slot(size_t i) const {  // [numel] param i's place in its bucket
    return buckets[size_t(bucket_of[i])].flat.narrow(0, offset_of[i], params[i].numel());
  }
  void settle(size_t i) {
    at::NoGradGuard no_grad;
    at::Tensor& p = params[i];
    at::Tensor sl = slot(i);
    if (!p.grad().defined())
      sl.zero_();
    else if (p.grad().data_ptr() != sl.data_ptr())  // (a linear layer wrote it into the slot: grad_slot.h)
      sl.copy_(p.grad().reshape({-1}));
    p.mutable_grad() = sl.view(p.sizes());
    unset[i] = false;
  }
  void settle_all() {
    settle_queued = false;
    for (size_t i = 0; i < params.size(); ++i)
      if (unset[i]) settle(i);
  }
  void on_accumulated(size_t i) {
    if (!unset[i]) return;
    settle(i);
    if (!settle_queued) {  // queued before the bucket hooks' own callback
      settle_queued = true;
      std::weak_ptr<DdpState> weak = self;
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        if (auto st = weak.lock()) st->settle_all();
      });
    }
  }

  void launch(size_t b) {
    Bucket& bucket = buckets[b];
    // reduce_dtype bf16: half the bytes on the wire; the sum comes back
    // into the fp32 bucket after the wait (finish_gradient_sync).
    at::Tensor target = bucket.flat;
    if (options.reduce_bf16) target = bucket.wire = target.to(at::kBFloat16);
    bucket.work = dp->all_reduce(target, /*async=*/true);
  }

  void reset_for_next_step() {
    for (auto& b : buckets) b.work.reset();
    hooks.reset();
  }
};

namespace {

// After AccumulateGrad, before the bucket hooks' countdown (registered first).
class SettleHook : public torch::autograd::FunctionPostHook {
 public:
  SettleHook(std::weak_ptr<DdpState> state, size_t param) : state_(std::move(state)), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto s = state_.lock()) s->on_accumulated(param_);
    return outputs;
  }

 private:
  std::weak_ptr<DdpState> state_;
  size_t param_;
};

}  // namespace
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
  s.offset_of.assign(n, 0);
  s.unset.assign(n, false);
  s.self = state_;

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
  std::vector<int64_t> lengths;  // each bucket's numel
  for (auto& g : groups) {
    if (g.empty()) continue;
    detail::Bucket b;
    int64_t numel = 0;
    for (int i : g) {
      b.params.push_back(i);
      b.offsets.push_back(numel);
      numel += s.params[i].numel();
    }
    lengths.push_back(numel);
    s.buckets.push_back(std::move(b));
  }
  // Where the dp group runs through shared memory, the buckets live in its
  // symmetric buffer (symmetric_buffer.h), each from a 64-byte line: their
  // all-reduce adds the ranks' buckets where they lie, with no staging copy
  // in and no copy out. Elsewhere (NCCL, across machines, a bf16 wire copy)
  // each is a tensor of its own.
  const auto padded = [](int64_t numel) { return (numel + 15) / 16 * 16; };
  int64_t total = 0;
  for (int64_t len : lengths) total += padded(len);
  at::Tensor arena;
  if (dp.size() > 1 && dp.device().is_cpu() && !options.reduce_bf16 && total > 0)
    arena = comm::symmetric_buffer(dp, total, at::kFloat);
  s.symmetric = arena.defined();
  for (size_t b = 0, at_elem = 0; b < s.buckets.size(); at_elem += size_t(padded(lengths[b])), ++b) {
    const auto opts = s.params[size_t(s.buckets[b].params[0])].options().requires_grad(false);
    s.buckets[b].flat = s.symmetric ? arena.narrow(0, int64_t(at_elem), lengths[b]) : at::zeros({lengths[b]}, opts);
  }

  at::NoGradGuard no_grad;
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    auto& bucket = s.buckets[b];
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      int i = bucket.params[k];
      at::Tensor& p = s.params[i];
      at::Tensor slot = bucket.flat.narrow(0, bucket.offsets[k], p.numel());
      s.bucket_of[i] = static_cast<int>(b);
      s.offset_of[i] = bucket.offsets[k];
      // Initial parameters from dp rank 0: pack into the (still unused)
      // bucket, broadcast, unpack.
      if (options.sync_initial_params) slot.copy_(p.reshape({-1}));
    }
    if (options.sync_initial_params && dp.size() > 1) dp.broadcast(bucket.flat, /*root=*/0)->wait();
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      at::Tensor& p = s.params[bucket.params[k]];
      at::Tensor slot = bucket.flat.narrow(0, bucket.offsets[k], p.numel());
      if (options.sync_initial_params) p.copy_(slot.view(p.sizes()));
      p.mutable_grad() = slot.view(p.sizes());  // [param shape] view into the bucket
      model::register_grad_slot(p, p.grad());   // linear layers write the first backward's grad here
    }
    bucket.flat.zero_();
  }

  std::vector<int> order;
  for (int b = 0; b < int(s.buckets.size()); ++b) order.push_back(b);
  detail::DdpState* state = state_.get();  // owns the hooks, so outlives every launch
  s.hooks = BucketHooks(s.bucket_of, std::move(order), [state](int b) { state->launch(size_t(b)); });
  for (int i = 0; i < n; ++i) {  // before the bucket hooks: they must see the slot filled
    auto acc = torch::autograd::impl::grad_accumulator(s.params[i]);
    acc->add_post_hook(std::make_unique<detail::SettleHook>(state_, size_t(i)));
    s.accumulators.push_back(std::move(acc));
  }
  if (dp.size() > 1) s.hooks.install(s.params);
  s.hooks.set_enabled(options.overlap);  // overlap off: every bucket after backward
  DTRAIN_DEBUG("ddp: {} params in {} buckets of up to {} MB, overlap {}, {}", n, s.buckets.size(),
               options.bucket_mb, options.overlap, s.symmetric ? "in the group's symmetric buffer" : "private");
}

Ddp::~Ddp() {
  for (size_t i = 0; i < state_->params.size(); ++i)
    model::unregister_grad_slot(state_->params[i], state_->slot(i));
}

void Ddp::set_grad_sync(bool enabled) {
  state_->sync = enabled;
  // A no_sync micro-step: the hooks launch nothing, grads just accumulate.
  state_->hooks.set_enabled(enabled && state_->options.overlap);
}
bool Ddp::grad_sync() const { return state_->sync; }

DdpSyncStats Ddp::finish_gradient_sync() {
  auto& s = *state_;
  DdpSyncStats stats;
  stats.buckets = static_cast<int>(s.buckets.size());
  s.settle_all();  // a backward that reached no parameter queued no settling
  if (s.dp->size() == 1) return stats;
  auto t0 = std::chrono::steady_clock::now();
  s.hooks.launch_rest();  // with overlap on: only buckets no hook completed
  for (auto& b : s.buckets) {
    b.work->wait();
    if (b.wire.defined()) {
      b.flat.copy_(b.wire);
      b.wire.reset();
    }
  }
  stats.wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats.launched_in_backward = s.hooks.take_launched_in_backward();

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
  auto& s = *state_;
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.params[i].mutable_grad().reset();
    model::arm_grad_slot(s.params[i]);
    s.unset[i] = true;
  }
}

std::vector<at::Tensor> Ddp::flat_grads() const {
  std::vector<at::Tensor> out;
  for (auto& b : state_->buckets) out.push_back(b.flat);
  return out;
}

int Ddp::num_buckets() const { return static_cast<int>(state_->buckets.size()); }
bool Ddp::symmetric() const { return state_->symmetric; }

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
