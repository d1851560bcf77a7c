// Work handles shared by the c10d-backed groups (gloo_group, nccl_group):
// an op that is already done, and a queued c10d op plus what to do once it
// finished (copy back, unflatten). Internal to engine/comm.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <mutex>
#include <string>

#include "engine/comm/comm.h"

namespace dtrain::engine::comm::detail {

[[noreturn]] void rethrow_comm_error(const std::string& group, const std::string& op);
c10d::ReduceOp to_c10d(ReduceOp op);

class DoneWork : public Work {
 public:
  void wait() override {}
};

// wait() is c10d's: on the CPU it returns when the op finished; with NCCL it
// makes the current CUDA stream wait for the op (the host does not block).
class C10dWork : public Work {
 public:
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, std::string group,
           std::string op)
      : work_(std::move(work)), finish_(std::move(finish)), group_(std::move(group)),
        op_(std::move(op)) {}

  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    try {
      work_->wait();
    } catch (...) {
      done_ = true;
      rethrow_comm_error(group_, op_);
    }
    if (finish_) finish_();
    done_ = true;
  }

 private:
  std::mutex mu_;
  bool done_ = false;
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;
  std::string group_, op_;
};

}  // namespace dtrain::engine::comm::detail
