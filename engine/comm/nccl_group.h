// NcclGroup: comm::Group over c10d's NCCL backend (CUDA tensors on this
// rank's GPU). Internal to engine/comm; built only when LibTorch has CUDA
// (DTRAIN_WITH_CUDA). NCCL has every op natively (reduce-scatter, flat
// all-gather, bf16), so nothing is emulated here. A group of one rank still
// goes through NCCL, so a one-GPU machine exercises it.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>

#include "engine/comm/comm.h"

namespace dtrain::engine::comm::detail {

// Connects `size` ranks through `store` (collective; NCCL's communicator is
// made lazily at the first op, on the current device).
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size, double timeout_s);

class NcclGroup : public Group {
 public:
  NcclGroup(std::string name, std::vector<int> global_ranks, int rank,
            c10::intrusive_ptr<c10d::Backend> pg, c10::Device device);

  const std::string& name() const override { return name_; }
  const std::string& backend() const override;
  c10::Device device() const override { return device_; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }

  WorkPtr all_reduce(at::Tensor& t, bool async = false, ReduceOp op = ReduceOp::sum) override;
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out, bool async) override;
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, bool async) override;
  WorkPtr broadcast(at::Tensor& t, int root, bool async) override;
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits, bool async) override;
  WorkPtr send(const at::Tensor& t, int peer, int tag) override;
  WorkPtr recv(at::Tensor& t, int peer, int tag) override;
  void barrier() override;

  uint64_t bytes_sent() const override { return bytes_.load(); }
  void reset_bytes_sent() override { bytes_.store(0); }

 private:
  WorkPtr wrap(c10::intrusive_ptr<c10d::Work> work, const char* op, bool async);
  void check(const at::Tensor& t, const char* op) const;

  std::string name_;
  std::vector<int> global_ranks_;
  int rank_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  c10::Device device_;
  std::atomic<uint64_t> bytes_{0};
};

}  // namespace dtrain::engine::comm::detail
