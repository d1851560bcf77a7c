// Work handles shared by the c10d-backed groups (gloo_group, nccl_group):
// an op that is already done, and a queued c10d op plus what to do once it
// finished (copy back, unflatten). Internal to engine/comm.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "engine/comm/comm.h"

namespace dtrain::engine::comm::detail {

[[noreturn]] void rethrow_comm_error(const std::string& group, const std::string& op);
c10d::ReduceOp to_c10d(ReduceOp op);

// Waits for a Gloo collective, leaving with dtrain::Error(worker_failed)
// once the round is over (recovery in place, round_abort.h). Shutting the
// process's sockets down does not always reach a Gloo op: a send already
// handed to a pair can wait in UnboundBuffer::waitSend for good (seen in a
// checkpoint's barrier after a round change; c10d's wait() has no way out).
// So the op's future signals a condition variable, and the wait checks the
// round's flag every 50 ms. Then work->wait() gives the op's result or
// error. An op without a future (send, recv) waits in work->wait() with a
// RoundEndAbort that aborts it when the round ends (c10d's
// SendWork/RecvWork::abort: no shut socket wakes that wait either).
// Either way: the op's result, its error, or worker_failed when the round ends.
void wait_unless_round_ends(const c10::intrusive_ptr<c10d::Work>& work, const char* op);

class DoneWork : public Work {
 public:
  void wait() override {}
};

// wait() is c10d's: on the CPU it returns when the op finished; with NCCL it
// makes the current CUDA stream wait for the op (the host does not block).
class C10dWork : public Work {
 public:
  // abortable: a Gloo op (wait_unless_round_ends); NCCL's wait() does not block the host.
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, std::string group,
           std::string op, bool abortable = false)
      : work_(std::move(work)), finish_(std::move(finish)), group_(std::move(group)),
        op_(std::move(op)), abortable_(abortable) {}

  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    try {
      if (abortable_)
        wait_unless_round_ends(work_, op_.c_str());
      else
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
  bool abortable_ = false;
};

}  // namespace dtrain::engine::comm::detail
