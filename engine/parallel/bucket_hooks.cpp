// BucketHooks (bucket_hooks.h): the per-parameter post-hooks, the counts per
// bucket, the in-order launch and the end-of-backward callback.
#include "engine/parallel/bucket_hooks.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace dtrain::engine::parallel {
namespace detail {

struct BucketHooksState : std::enable_shared_from_this<BucketHooksState> {
  std::vector<int> bucket_of;  // param -> bucket
  std::vector<int> order;      // buckets in launch order
  std::vector<int> size;       // params per bucket
  std::vector<int> pending;    // params of each bucket not yet ready in this backward
  BucketHooks::Launch launch;
  size_t next_to_launch = 0;  // index into `order`: buckets launch in that order only
  bool enabled = true;
  bool callback_queued = false;
  int launched_in_backward = 0;
  // The hooks hang off these nodes; a param's accumulator is only weakly
  // referenced by the param, so without these the hooks would vanish.
  // (shared_ptr in LibTorch 2.11, intrusive_ptr in later versions)
  using AccumulatorPtr =
      decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  std::vector<AccumulatorPtr> accumulators;

  void launch_ready_in_order() {
    while (next_to_launch < order.size() && pending[size_t(order[next_to_launch])] == 0) {
      launch(order[next_to_launch++]);
      ++launched_in_backward;
    }
  }
  void launch_rest() {
    while (next_to_launch < order.size()) launch(order[next_to_launch++]);
  }
  void on_grad_ready(int param) {
    if (!enabled) return;
    if (!callback_queued) {
      callback_queued = true;
      std::weak_ptr<BucketHooksState> weak = weak_from_this();
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        if (auto s = weak.lock()) s->launch_rest();
      });
    }
    if (--pending[size_t(bucket_of[size_t(param)])] == 0) launch_ready_in_order();
  }
};

namespace {

// Fires after AccumulateGrad has added this backward's gradient into the
// param's grad.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::weak_ptr<BucketHooksState> state, int param) : state_(std::move(state)), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto s = state_.lock()) s->on_grad_ready(param_);
    return outputs;
  }

 private:
  std::weak_ptr<BucketHooksState> state_;
  int param_;
};

}  // namespace
}  // namespace detail

BucketHooks::BucketHooks(std::vector<int> bucket_of, std::vector<int> order, Launch launch)
    : s_(std::make_shared<detail::BucketHooksState>()) {
  s_->size.assign(order.size(), 0);
  for (int b : bucket_of) ++s_->size.at(size_t(b));
  s_->bucket_of = std::move(bucket_of);
  s_->order = std::move(order);
  s_->launch = std::move(launch);
  reset();
}

void BucketHooks::install(const std::vector<at::Tensor>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    acc->add_post_hook(std::make_unique<detail::GradReadyHook>(s_, int(i)));
    s_->accumulators.push_back(std::move(acc));
  }
}

void BucketHooks::set_enabled(bool on) { s_->enabled = on; }
bool BucketHooks::enabled() const { return s_->enabled; }
void BucketHooks::launch_rest() { s_->launch_rest(); }

void BucketHooks::reset() {
  s_->pending = s_->size;
  s_->next_to_launch = 0;
  s_->callback_queued = false;
}

int BucketHooks::take_launched_in_backward() {
  const int n = s_->launched_in_backward;
  s_->launched_in_backward = 0;
  return n;
}

}  // namespace dtrain::engine::parallel
