// NoSyncGroup: the negative control of the parity tests (fault.kind
// no_grad_sync) as a Group. Its reductions leave every rank with its own data;
// every other op goes to the group it wraps. Not a decorator of the
// ForwardingGroup kind: it does not own the wrapped group.
#pragma once

#include "engine/comm/comm.h"

namespace dtrain::engine::comm {

// all_reduce: the tensor is left as it is (each rank keeps its own values,
// any op). reduce_scatter: `out` = this rank's own chunk of `in`, unsummed
// (as if every other rank had sent zeros). Both are done on return and
// send nothing. all_gather, broadcast, all_to_all, send, recv and barrier
// are the wrapped group's, so what a sync moves that is not a gradient sum
// (ZeRO's parameter all-gathers, DDP's initial broadcast) still moves and
// a no-sync run still trains, each rank on its own gradient. rank(), size()
// and the rest are the wrapped group's: shards are cut as without the fault.
// `inner` must outlive it.
class NoSyncGroup : public Group {
 public:
  explicit NoSyncGroup(Group& inner) : inner_(inner) {}

  Group& inner() const { return inner_; }

  const std::string& name() const override { return inner_.name(); }
  const std::string& backend() const override { return inner_.backend(); }
  std::string path() const override { return inner_.path(); }
  c10::Device device() const override { return inner_.device(); }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::vector<int>& global_ranks() const override { return inner_.global_ranks(); }

  WorkPtr all_reduce(at::Tensor& t, bool async = false, ReduceOp op = ReduceOp::sum) override;
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, bool async = false) override;

  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out, bool async = false) override {
    return inner_.all_gather(in, out, async);
  }
  WorkPtr broadcast(at::Tensor& t, int root, bool async = false) override { return inner_.broadcast(t, root, async); }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits, bool async) override {
    return inner_.all_to_all(in, out, out_splits, in_splits, async);
  }
  WorkPtr send(const at::Tensor& t, int peer, int tag) override { return inner_.send(t, peer, tag); }
  WorkPtr recv(at::Tensor& t, int peer, int tag) override { return inner_.recv(t, peer, tag); }
  void barrier() override { inner_.barrier(); }
  // What really went on the wire: the wrapped group's ops only.
  uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  void reset_bytes_sent() override { inner_.reset_bytes_sent(); }

 private:
  Group& inner_;
};

// The group that really reduces: `g` itself, or the group a NoSyncGroup
// wraps. Figures about the gradients that are not the gradients (the
// squared norm for clipping) are summed over it, so the fault changes which
// gradient each rank trains on, not how its norm is computed.
Group& reducing_group(Group& g);

}  // namespace dtrain::engine::comm
