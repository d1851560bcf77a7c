// BucketHooks: the backward-order launch of gradient communication that DDP
// and ZeRO share (c10d's Reducer). A post-hook on every parameter's
// AccumulateGrad node counts down its bucket (a DDP bucket, a ZeRO unit);
// complete buckets are launched strictly in one fixed order, so every rank
// issues the same collectives in the same order. Does not know what a launch
// communicates, nor when the caller waits for it.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace dtrain::engine::parallel {

namespace detail {
struct BucketHooksState;
}

// Not thread-safe by design: CPU autograd runs hooks and callbacks on the
// thread that called backward().
class BucketHooks {
 public:
  using Launch = std::function<void(int bucket)>;

  BucketHooks() = default;  // empty until assigned; only for members built later
  // bucket_of[i]: the bucket of parameter i; order: every bucket once, in
  // the order they must launch (the order backward completes them).
  BucketHooks(std::vector<int> bucket_of, std::vector<int> order, Launch launch);

  // A post-hook on params[i]'s gradient accumulator (params in bucket_of's
  // indexing); the hooks live as long as this object. Once per parameter.
  void install(const std::vector<at::Tensor>& params);

  // While off the hooks count nothing (a no_sync micro-step, DDP with
  // overlap off): the caller launches everything with launch_rest().
  void set_enabled(bool on);
  bool enabled() const;

  // Launches every bucket not launched yet, in order. The first hook of a
  // backward queues it as an end-of-backward callback too, for buckets
  // holding parameters that got no gradient (they never count down).
  void launch_rest();
  // Before the next backward: every count full, nothing launched.
  void reset();
  // Buckets a hook launched (not launch_rest) since the last call.
  int take_launched_in_backward();

 private:
  std::shared_ptr<detail::BucketHooksState> s_;  // the hooks hold a weak_ptr to it
};

}  // namespace dtrain::engine::parallel
