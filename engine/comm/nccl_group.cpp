// NcclGroup (nccl_group.h) and make_nccl_backend: the one translation unit
// that includes ProcessGroupNCCL.hpp (compiled with USE_C10D_NCCL and the
// wheel's nccl.h). Byte counts follow comm.h's table, with NCCL's ring
// figures for all_reduce and reduce_scatter.
#include "engine/comm/nccl_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <ATen/ops/ones.h>

#include "common/error.h"
#include "engine/comm/c10d_work.h"
#include "engine/device/device.h"

namespace dtrain::engine::comm::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size, double timeout_s) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
}

NcclGroup::NcclGroup(std::string name, std::vector<int> global_ranks, int rank,
                     c10::intrusive_ptr<c10d::Backend> pg, c10::Device device)
    : name_(std::move(name)), global_ranks_(std::move(global_ranks)), rank_(rank),
      pg_(std::move(pg)), device_(device) {}

const std::string& NcclGroup::backend() const {
  static const std::string kNccl = "nccl";
  return kNccl;
}

void NcclGroup::check(const at::Tensor& t, const char* op) const {
  if (t.device() != device_ || !t.is_contiguous())
    throw Error(ErrorCode::internal, std::string(op) + " on NCCL group " + name_ +
                                         ": tensors must be contiguous on " + device_.str() +
                                         ", got " + t.device().str());
}

WorkPtr NcclGroup::wrap(c10::intrusive_ptr<c10d::Work> work, const char* op, bool async) {
  auto w = std::make_shared<C10dWork>(std::move(work), nullptr, name_, op);
  if (!async) w->wait();
  return w;
}

WorkPtr NcclGroup::all_reduce(at::Tensor& t, bool async, ReduceOp op) {
  check(t, "all_reduce");
  const int n = size();
  bytes_ += static_cast<uint64_t>(2 * (n - 1) * int64_t(t.nbytes()) / n);
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  try {
    return wrap(pg_->allreduce(v, opts), "all_reduce", async);
  } catch (...) {
    rethrow_comm_error(name_, "all_reduce");
  }
}

WorkPtr NcclGroup::all_gather(const at::Tensor& in, at::Tensor& out, bool async) {
  check(in, "all_gather");
  check(out, "all_gather");
  const int n = size();
  if (out.numel() != n * in.numel() || out.scalar_type() != in.scalar_type())
    throw Error(ErrorCode::internal, "all_gather on group " + name_ + ": out has " +
                                         std::to_string(out.numel()) + " elements, expected " +
                                         std::to_string(n) + " x " + std::to_string(in.numel()));
  bytes_ += static_cast<uint64_t>((n - 1) * in.nbytes());
  at::Tensor flat_out = out.view({-1});
  at::Tensor flat_in = in.reshape({-1});
  try {
    return wrap(pg_->_allgather_base(flat_out, flat_in), "all_gather", async);
  } catch (...) {
    rethrow_comm_error(name_, "all_gather");
  }
}

WorkPtr NcclGroup::reduce_scatter(const at::Tensor& in, at::Tensor& out, bool async) {
  check(in, "reduce_scatter");
  check(out, "reduce_scatter");
  const int n = size();
  if (in.numel() != n * out.numel() || out.scalar_type() != in.scalar_type())
    throw Error(ErrorCode::internal, "reduce_scatter on group " + name_ + ": in has " +
                                         std::to_string(in.numel()) + " elements, expected " +
                                         std::to_string(n) + " x " + std::to_string(out.numel()));
  bytes_ += static_cast<uint64_t>((n - 1) * int64_t(in.nbytes()) / n);
  at::Tensor flat_out = out.view({-1});
  at::Tensor flat_in = in.reshape({-1});
  try {
    return wrap(pg_->_reduce_scatter_base(flat_out, flat_in), "reduce_scatter", async);
  } catch (...) {
    rethrow_comm_error(name_, "reduce_scatter");
  }
}

WorkPtr NcclGroup::broadcast(at::Tensor& t, int root, bool async) {
  check(t, "broadcast");
  const int n = size();
  if (root < 0 || root >= n)
    throw Error(ErrorCode::internal, "broadcast on group " + name_ + ": root " +
                                         std::to_string(root) + " not in [0, " +
                                         std::to_string(n) + ")");
  bytes_ += static_cast<uint64_t>((n - 1) * int64_t(t.nbytes()) / n);
  std::vector<at::Tensor> v{t};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  try {
    return wrap(pg_->broadcast(v, opts), "broadcast", async);
  } catch (...) {
    rethrow_comm_error(name_, "broadcast");
  }
}

WorkPtr NcclGroup::all_to_all(const at::Tensor& in, at::Tensor& out,
                              const std::vector<int64_t>& out_splits,
                              const std::vector<int64_t>& in_splits, bool async) {
  check(in, "all_to_all");
  check(out, "all_to_all");
  const int n = size();
  int64_t in_rows = 0, out_rows = 0;
  for (auto s : in_splits) in_rows += s;
  for (auto s : out_splits) out_rows += s;
  if (static_cast<int>(in_splits.size()) != n || static_cast<int>(out_splits.size()) != n ||
      in.dim() == 0 || out.dim() == 0 || in_rows != in.size(0) || out_rows != out.size(0))
    throw Error(ErrorCode::internal, "all_to_all on group " + name_ +
                                         ": splits do not match the tensors' rows");
  const int64_t row = in.size(0) == 0 ? 0 : in.numel() / in.size(0);
  bytes_ += static_cast<uint64_t>((in_rows - in_splits[rank_]) * row * in.element_size());
  at::Tensor o = out, i = in;
  std::vector<int64_t> os = out_splits, is = in_splits;
  try {
    return wrap(pg_->alltoall_base(o, i, os, is), "all_to_all", async);
  } catch (...) {
    rethrow_comm_error(name_, "all_to_all");
  }
}

WorkPtr NcclGroup::send(const at::Tensor& t, int peer, int tag) {
  check(t, "send");
  if (peer < 0 || peer >= size() || peer == rank_)
    throw Error(ErrorCode::internal, "send on group " + name_ + ": bad peer " + std::to_string(peer));
  bytes_ += t.nbytes();
  std::vector<at::Tensor> v{t};
  try {
    return wrap(pg_->send(v, peer, tag), "send", true);
  } catch (...) {
    rethrow_comm_error(name_, "send");
  }
}

WorkPtr NcclGroup::recv(at::Tensor& t, int peer, int tag) {
  check(t, "recv");
  if (peer < 0 || peer >= size() || peer == rank_)
    throw Error(ErrorCode::internal, "recv on group " + name_ + ": bad peer " + std::to_string(peer));
  std::vector<at::Tensor> v{t};
  try {
    return wrap(pg_->recv(v, peer, tag), "recv", true);
  } catch (...) {
    rethrow_comm_error(name_, "recv");
  }
}

// A one-element all-reduce, then the host waits for the device: every member
// has reached this point and all earlier work on this stream is done.
void NcclGroup::barrier() {
  at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
  all_reduce(one, /*async=*/false);
  bytes_ -= static_cast<uint64_t>(2 * (size() - 1) * 4 / size());
  device::synchronize(device_);
}

}  // namespace dtrain::engine::comm::detail
