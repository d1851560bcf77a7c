// zero_state.h: ZeRO-3's gathers and barriers, and every stage's gradient
// launch. ZeRO-3 frees a unit's gathered parameters by giving its flat
// buffer's storage zero bytes (the parameters, and every view autograd saved
// of them, share that storage) and gathers by giving it its bytes back
// (FSDP's trick).
#include "engine/parallel/zero/zero_state.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include <chrono>

#include "engine/model/grad_slot.h"

namespace dtrain::engine::parallel::zero {
namespace {

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void alloc_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

}  // namespace

void ZeroState::meet() {
  if (!token.defined()) token = at::zeros({1}, at::TensorOptions().dtype(at::kFloat));
  dp->all_reduce(token);
}

void ZeroState::start_gather(int u, int next) {
  Unit& x = units[size_t(u)];
  if (shared || x.gathered || x.gather) return;
  if (offload) {
    offload->page_in(u);
    if (options.offload_prefetch) offload->prefetch(next);
  }
  alloc_storage(x.full, size_t(x.full.numel()) * x.full.element_size());
  x.gather = dp->all_gather(x.param_shard, x.full, /*async=*/true);
}

void ZeroState::ensure_gathered(int u, int next) {
  Unit& x = units[size_t(u)];
  if (shared) {  // the first gather after a step: every shard written
    if (!sync_due) return;
    sync_due = false;
    const auto t0 = std::chrono::steady_clock::now();
    meet();
    exposed_gather_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  if (x.gathered) return;
  start_gather(u, next);
  const auto t0 = std::chrono::steady_clock::now();
  x.gather->wait();
  exposed_gather_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  x.gather.reset();
  x.gathered = true;
  if (offload) offload->page_out(u);  // unchanged since read: nothing to write
}

void ZeroState::release(int u) {
  if (shared) return;
  Unit& x = units[size_t(u)];
  if (x.gather) ensure_gathered(u);
  if (!x.gathered) return;
  free_storage(x.full);
  x.gathered = false;
}

at::Tensor ZeroState::pending_input(int u) {
  const int64_t padded = layout.units[size_t(u)].padded;
  if (!input_pool.empty()) {
    int k = -1;
    for (size_t b = 0; b < input_pool.size() && k < 0; ++b)
      if (pool_user[b] < 0) k = int(b);
    if (k < 0) {  // all taken: free the one whose reduce-scatter started first
      int oldest = -1;
      for (int v : pool_user)
        if (units[size_t(v)].reduce && (oldest < 0 || launched_at[size_t(v)] < launched_at[size_t(oldest)]))
          oldest = v;
      if (oldest >= 0) {
        k = pool_of[size_t(oldest)];
        wait_reduce(oldest);
      }
    }
    if (k >= 0) {  // (else every buffer waits for its unit's launch: a tensor of its own)
      pool_user[size_t(k)] = u;
      pool_of[size_t(u)] = k;
      return input_pool[size_t(k)].narrow(0, 0, padded);
    }
  }
  return at::empty({padded}, units[size_t(u)].param_shard.options());
}

at::Tensor ZeroState::grad_slot(int u, int64_t offset, int i) {
  Unit& x = units[size_t(u)];
  if (!x.pending.defined()) x.pending = pending_input(u);
  const at::Tensor& p = params[size_t(i)];
  return x.pending.narrow(0, offset, p.numel()).view(p.sizes());
}

void ZeroState::launch(int u) {
  Unit& x = units[size_t(u)];
  const FlatUnit& fu = layout.units[size_t(u)];
  if (stage() == 1) {
    x.reduce = dp->all_reduce(x.grad_full, /*async=*/true);
    return;
  }
  // Pack the unit's grads into one flat buffer (zeros for padding and for
  // parameters that got no grad; the linear layers' weight grads are in
  // it already) and drop them: from here on only the shard is kept.
  x.reduce_in = x.pending.defined() ? std::move(x.pending) : pending_input(u);  // [padded]
  x.pending = at::Tensor();
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < fu.params.size(); ++k) {
    at::Tensor& p = params[size_t(fu.params[k])];
    at::Tensor slot = x.reduce_in.narrow(0, fu.offsets[k], p.numel());
    if (!p.grad().defined())
      slot.zero_();
    else if (p.grad().data_ptr() != slot.data_ptr())
      slot.copy_(p.grad().reshape({-1}));
    p.mutable_grad().reset();
    model::arm_grad_slot(p);  // the next backward's first grad goes into the next pending input
  }
  if (fu.padded > fu.numel) x.reduce_in.narrow(0, fu.numel, fu.padded - fu.numel).zero_();
  x.reduce_out = x.shard_stale ? x.grad_shard : at::empty({fu.shard}, x.param_shard.options());  // [S]
  if (!launched_at.empty()) launched_at[size_t(u)] = launches++;
  x.reduce = dp->reduce_scatter(x.reduce_in, x.reduce_out, /*async=*/true);
  if (stage() == 3) release(u);  // its backward is done
}

void ZeroState::wait_reduce(int u) {
  Unit& x = units[size_t(u)];
  if (!x.reduce) return;
  x.reduce->wait();
  x.reduce.reset();
  if (stage() == 1) return;
  at::NoGradGuard no_grad;
  if (x.shard_stale)
    x.shard_stale = false;  // reduced into grad_shard itself
  else
    x.grad_shard.add_(x.reduce_out);
  x.reduce_in = at::Tensor();
  x.reduce_out = at::Tensor();
  if (!pool_of.empty() && pool_of[size_t(u)] >= 0) {  // every rank has read it: free for the next unit
    pool_user[size_t(pool_of[size_t(u)])] = -1;
    pool_of[size_t(u)] = -1;
  }
}

}  // namespace dtrain::engine::parallel::zero
