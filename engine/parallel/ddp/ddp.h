// Data parallelism the way PyTorch DDP does it (docs/ARCHITECTURE.md, 'Data parallelism:
// DDP and ZeRO-1/2/3' and 'The parity recipe'): gradients live in flat buckets filled in
// reverse registration order; each bucket's async all-reduce (SUM over the dp group)
// starts from the autograd hooks as soon as all its grads are ready, while backward goes
// on. Owns the buckets and the hooks; does not scale the loss or step the optimizer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/parallel/grad_sync.h"

namespace dtrain::engine::parallel {

struct DdpOptions {
  static constexpr double kDefaultBucketMb = 25.0;
  double bucket_mb = kDefaultBucketMb;  // bucket capacity; a bucket closes once it reaches this
  bool overlap = true;                  // false: all-reduce every bucket after backward
  bool reduce_bf16 = false;             // parallel.reduce_dtype bf16: all-reduce a bf16 copy of each bucket
  bool sync_initial_params = true;      // false: no broadcast from dp rank 0 (a restore loads them all next)
};

// What one synchronised step cost: GradSync's figures (grad_sync.h).
using DdpSyncStats = SyncStats;

namespace detail {
struct DdpState;
}

// Gradients are views into the flat buckets (PyTorch's gradient_as_bucket_view):
// every param.grad() is a slice of its bucket, and autograd accumulates into
// it in place, so there is no copy out. zero_grad() unsets the grads instead
// of filling zeros: the step's first backward hands each gradient over as
// it is, copied once into its slot (no zero fill and add), and the grad is
// the slot view again by the end of that backward. Zero them only with
// zero_grad(); never reassign them.
//
// Loss normalisation (docs/ARCHITECTURE.md, 'The parity recipe'): the caller scales
// each local micro-batch loss by 1 / (grad_accum * dp) before backward, so the SUM
// of the ranks' gradients is the 1-process gradient of the global-batch mean loss.
// The all-reduce is therefore a plain SUM; nothing is divided afterwards.
class Ddp {
 public:
  // params in registration order (model->named_parameters()); fp32, on dp.device(),
  // contiguous, requires_grad. Broadcasts them from dp rank 0 so every rank
  // starts from the same numbers (collective: every dp rank must construct).
  Ddp(std::vector<std::pair<std::string, at::Tensor>> named_params, comm::Group& dp,
      DdpOptions options = {});
  ~Ddp();
  Ddp(const Ddp&) = delete;
  Ddp& operator=(const Ddp&) = delete;

  // PyTorch's no_sync(): false for every micro-step but the last of a step,
  // so the hooks skip the all-reduce and grads just accumulate locally.
  void set_grad_sync(bool enabled);
  bool grad_sync() const;

  // After the last micro-step's backward: launch what has not been launched
  // (everything, with overlap off), then wait for every bucket. On return the
  // grads hold the dp-wide sum and are identical on every dp rank.
  DdpSyncStats finish_gradient_sync();

  void zero_grad();  // the next backward overwrites the buckets (see above)

  // The flat buckets: together exactly the grads of every param, so a norm or
  // a scale over them is one op per bucket instead of one per param.
  std::vector<at::Tensor> flat_grads() const;

  int num_buckets() const;
  // The buckets are ranges of the dp group's symmetric buffer (symmetric_buffer.h).
  bool symmetric() const;
  int64_t grad_bytes() const;  // bytes of all buckets
  // Params of bucket i, in the order they sit in it (tests, logging).
  std::vector<std::string> bucket_params(int i) const;

 private:
  std::shared_ptr<detail::DdpState> state_;
};

}  // namespace dtrain::engine::parallel
