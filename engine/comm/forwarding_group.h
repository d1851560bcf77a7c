// The base of Group decorators (traced_group, shm_group): every op and
// property forwards to the group it wraps, so a decorator overrides only
// what it changes. Internal to engine/comm.
#pragma once

#include <memory>
#include <utility>

#include "engine/comm/comm.h"

namespace dtrain::engine::comm::detail {

class ForwardingGroup : public Group {
 public:
  explicit ForwardingGroup(std::unique_ptr<Group> inner) : inner_(std::move(inner)) {}
  Group& inner() const { return *inner_; }  // the group this one decorates

  const std::string& name() const override { return inner_->name(); }
  const std::string& backend() const override { return inner_->backend(); }
  std::string path() const override { return inner_->path(); }
  c10::Device device() const override { return inner_->device(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::vector<int>& global_ranks() const override { return inner_->global_ranks(); }

  WorkPtr all_reduce(at::Tensor& t, bool async, ReduceOp op) override { return inner_->all_reduce(t, async, op); }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out, bool async) override {
    return inner_->all_gather(in, out, async);
  }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, bool async) override {
    return inner_->reduce_scatter(in, out, async);
  }
  WorkPtr broadcast(at::Tensor& t, int root, bool async) override { return inner_->broadcast(t, root, async); }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits, bool async) override {
    return inner_->all_to_all(in, out, out_splits, in_splits, async);
  }
  WorkPtr send(const at::Tensor& t, int peer, int tag) override { return inner_->send(t, peer, tag); }
  WorkPtr recv(at::Tensor& t, int peer, int tag) override { return inner_->recv(t, peer, tag); }
  void barrier() override { inner_->barrier(); }
  uint64_t bytes_sent() const override { return inner_->bytes_sent(); }
  void reset_bytes_sent() override { inner_->reset_bytes_sent(); }

 protected:
  std::unique_ptr<Group> inner_;
};

}  // namespace dtrain::engine::comm::detail
