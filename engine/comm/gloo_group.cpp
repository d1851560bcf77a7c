// GlooGroup's Gloo-backed operations and the one adapter from c10d/c10
// failures to dtrain::Error (shared with nccl_group). bf16 never reaches Gloo
// (LibTorch 1.13's crashed its peers, and summing in fp32 keeps one addition
// order whatever Gloo supports): reductions travel as fp32, pure data
// movement as the same bits viewed as fp16. The ring reduce-scatter is in
// gloo_ring.cpp.
#include "engine/comm/gloo_group.h"
#include "engine/comm/c10d_work.h"

#include <ATen/ops/empty.h>

#include <cstring>

#include "common/error.h"
#include "engine/comm/round_abort.h"

namespace dtrain::engine::comm::detail {

namespace {

// A send's or recv's wait (no future): aborted when the round ends.
void wait_p2p_unless_round_ends(const c10::intrusive_ptr<c10d::Work>& work, const char* op) {
  // Registered before the round's flag is read: an end_round() after the
  // read finds the abort registered (Gloo keeps it for the coming wait).
  RoundEndAbort guard([work] { work->abort(); });
  throw_if_round_aborted(op);
  if (!work->wait()) {  // false: aborted (Gloo's waitSend/waitRecv returned without the data)
    throw_if_round_aborted(op);
    throw Error(ErrorCode::worker_failed, std::string(op) + " was aborted before it completed",
                "see the other ranks' errors");
  }
}

}  // namespace

void wait_unless_round_ends(const c10::intrusive_ptr<c10d::Work>& work, const char* op) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work->getFuture();
  } catch (const c10::Error&) {
  }
  if (!future) return wait_p2p_unless_round_ends(work, op);  // send, recv
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();  // outlives this wait if the round ends first
  future->addCallback([done](c10::ivalue::Future&) {
    {
      std::lock_guard<std::mutex> lock(done->mu);
      done->done = true;
    }
    done->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(done->mu);
  while (!done->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return done->done; })) {
    lock.unlock();
    throw_if_round_aborted(op);
    lock.lock();
  }
  lock.unlock();
  work->wait();  // the op's result or error
}

namespace {

bool is_bf16(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }

// Same bytes, a dtype Gloo knows: for ops that only move data.
at::Tensor wire_view(const at::Tensor& t) { return is_bf16(t) ? t.view(at::kHalf) : t; }

int64_t wire_nbytes(const at::Tensor& t) {
  return is_bf16(t) ? t.numel() * 4 : static_cast<int64_t>(t.nbytes());
}

}  // namespace

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return c10d::ReduceOp::SUM;
    case ReduceOp::max: return c10d::ReduceOp::MAX;
    case ReduceOp::min: return c10d::ReduceOp::MIN;
  }
  throw Error(ErrorCode::internal, "unknown ReduceOp");
}

[[noreturn]] void rethrow_comm_error(const std::string& group, const std::string& op) {
  std::string what;
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = e.what();
  }
  bool timed_out = what.find("imed out") != std::string::npos ||
                   what.find("imeout") != std::string::npos;
  throw Error(timed_out ? ErrorCode::timeout : ErrorCode::worker_failed,
              op + " on group " + group + " failed: " + what,
              timed_out ? "a peer did not reach the same collective in time (options.timeout_s)"
                        : "a peer rank probably exited; see its log for the first failure");
}

GlooGroup::GlooGroup(std::string name, std::vector<int> global_ranks, int rank,
                     c10::intrusive_ptr<c10d::Backend> pg, int slot, bool native_reduce_scatter)
    : name_(std::move(name)), global_ranks_(std::move(global_ranks)), rank_(rank),
      pg_(std::move(pg)), slot_(slot), native_reduce_scatter_(native_reduce_scatter) {}

GlooGroup::~GlooGroup() = default;

void GlooGroup::check(const at::Tensor& t, const char* op) const {
  if (!t.device().is_cpu() || !t.is_contiguous())
    throw Error(ErrorCode::internal,
                std::string(op) + " on group " + name_ + ": tensors must be CPU and contiguous");
}

WorkPtr GlooGroup::gloo_work(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish,
                             const char* op, bool async) {
  auto w = std::make_shared<C10dWork>(std::move(work), std::move(finish), name_, op, /*abortable=*/true);
  if (!async) w->wait();
  return w;
}

WorkPtr GlooGroup::all_reduce(at::Tensor& t, bool async, ReduceOp op) {
  check(t, "all_reduce");
  int n = size();
  if (n == 1) return std::make_shared<DoneWork>();
  bytes_ += static_cast<uint64_t>(2 * (n - 1) * wire_nbytes(t) / n);
  at::Tensor wire = is_bf16(t) ? t.to(at::kFloat) : t;  // [numel] fp32 for bf16
  std::vector<at::Tensor> v{wire};
  std::function<void()> finish;
  if (is_bf16(t)) finish = [t, wire]() mutable { t.copy_(wire); };
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  try {
    return gloo_work(pg_->allreduce(v, opts), std::move(finish), "all_reduce", async);
  } catch (...) {
    rethrow_comm_error(name_, "all_reduce");
  }
}

WorkPtr GlooGroup::all_gather(const at::Tensor& in, at::Tensor& out, bool async) {
  check(in, "all_gather");
  check(out, "all_gather");
  int n = size();
  int64_t m = in.numel();
  if (out.numel() != n * m || out.scalar_type() != in.scalar_type())
    throw Error(ErrorCode::internal, "all_gather on group " + name_ + ": out has " +
                                         std::to_string(out.numel()) + " elements, expected " +
                                         std::to_string(n) + " x " + std::to_string(m));
  if (n == 1) {
    out.view({-1}).copy_(in.reshape({-1}));
    return std::make_shared<DoneWork>();
  }
  bytes_ += static_cast<uint64_t>((n - 1) * in.nbytes());
  // out viewed as n rows shaped like `in`: [n][in.sizes()]
  at::Tensor flat = wire_view(out).view({-1});
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int i = 0; i < n; ++i) outs[0].push_back(flat.narrow(0, i * m, m).view(in.sizes()));
  std::vector<at::Tensor> ins{wire_view(in)};
  try {
    return gloo_work(pg_->allgather(outs, ins), nullptr, "all_gather", async);
  } catch (...) {
    rethrow_comm_error(name_, "all_gather");
  }
}

WorkPtr GlooGroup::broadcast(at::Tensor& t, int root, bool async) {
  check(t, "broadcast");
  int n = size();
  if (root < 0 || root >= n)
    throw Error(ErrorCode::internal, "broadcast on group " + name_ + ": root " +
                                         std::to_string(root) + " not in [0, " +
                                         std::to_string(n) + ")");
  if (n == 1) return std::make_shared<DoneWork>();
  bytes_ += static_cast<uint64_t>((n - 1) * t.nbytes() / n);
  std::vector<at::Tensor> v{wire_view(t)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  try {
    return gloo_work(pg_->broadcast(v, opts), nullptr, "broadcast", async);
  } catch (...) {
    rethrow_comm_error(name_, "broadcast");
  }
}

WorkPtr GlooGroup::all_to_all(const at::Tensor& in, at::Tensor& out,
                              const std::vector<int64_t>& out_splits,
                              const std::vector<int64_t>& in_splits, bool async) {
  check(in, "all_to_all");
  check(out, "all_to_all");
  int n = size();
  int64_t in_rows = 0, out_rows = 0;
  for (auto s : in_splits) in_rows += s;
  for (auto s : out_splits) out_rows += s;
  int64_t row = in.dim() == 0 || in.size(0) == 0 ? 0 : in.numel() / in.size(0);
  if (static_cast<int>(in_splits.size()) != n || static_cast<int>(out_splits.size()) != n ||
      in.dim() == 0 || out.dim() == 0 || in_rows != in.size(0) || out_rows != out.size(0))
    throw Error(ErrorCode::internal, "all_to_all on group " + name_ + ": splits (" +
                                         std::to_string(in_rows) + " in, " +
                                         std::to_string(out_rows) + " out, " +
                                         std::to_string(in_splits.size()) +
                                         " entries) do not match the tensors' rows");
  if (n == 1) {
    out.copy_(in);
    return std::make_shared<DoneWork>();
  }
  int64_t sent_rows = in_rows - in_splits[rank_];
  bytes_ += static_cast<uint64_t>(sent_rows * row * in.element_size());
  at::Tensor o = wire_view(out), i = wire_view(in);
  std::vector<int64_t> os = out_splits, is = in_splits;
  try {
    return gloo_work(pg_->alltoall_base(o, i, os, is), nullptr, "all_to_all", async);
  } catch (...) {
    rethrow_comm_error(name_, "all_to_all");
  }
}

WorkPtr GlooGroup::send(const at::Tensor& t, int peer, int tag) {
  check(t, "send");
  if (peer < 0 || peer >= size() || peer == rank_ || tag < 0 || tag >= kMaxUserTag)
    throw Error(ErrorCode::internal, "send on group " + name_ + ": bad peer " +
                                         std::to_string(peer) + " or tag " + std::to_string(tag));
  bytes_ += t.nbytes();
  std::vector<at::Tensor> v{wire_view(t)};
  try {
    return gloo_work(pg_->send(v, peer, tag), nullptr, "send", true);
  } catch (...) {
    rethrow_comm_error(name_, "send");
  }
}

WorkPtr GlooGroup::recv(at::Tensor& t, int peer, int tag) {
  check(t, "recv");
  if (peer < 0 || peer >= size() || peer == rank_ || tag < 0 || tag >= kMaxUserTag)
    throw Error(ErrorCode::internal, "recv on group " + name_ + ": bad peer " +
                                         std::to_string(peer) + " or tag " + std::to_string(tag));
  std::vector<at::Tensor> v{wire_view(t)};
  try {
    return gloo_work(pg_->recv(v, peer, tag), nullptr, "recv", true);
  } catch (...) {
    rethrow_comm_error(name_, "recv");
  }
}

void GlooGroup::barrier() {
  ring_thread_.drain();
  if (size() == 1) return;
  try {
    auto work = pg_->barrier();
    wait_unless_round_ends(work, "barrier");
  } catch (...) {
    rethrow_comm_error(name_, "barrier");
  }
}

}  // namespace dtrain::engine::comm::detail
