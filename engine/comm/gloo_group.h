// GlooGroup: comm::Group over c10d's Gloo backend (CPU tensors), held as a
// c10d::Backend (gloo_backend.h makes it). Internal to engine/comm (code
// elsewhere uses comm.h). Gloo's own ops (all_reduce, all_gather, broadcast,
// all_to_all, send/recv, barrier) run on Gloo's threads; reduce_scatter is our
// ring over send/recv, run on this group's TaskThread so that async really
// overlaps. No NCCL here.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "engine/comm/comm.h"

namespace dtrain::engine::comm::detail {

// One background thread running tasks in submission order. Started on the
// first submit; the destructor finishes queued tasks and joins.
class TaskThread {
 public:
  TaskThread() = default;
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;
  ~TaskThread();

  std::shared_future<void> submit(std::function<void()> fn);
  void drain();  // returns when every task submitted so far has finished

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// Converts a Gloo/c10 failure into dtrain::Error (the one adapter for them).
[[noreturn]] void rethrow_comm_error(const std::string& group, const std::string& op);

class GlooGroup : public Group {
 public:
  // pg == nullptr only for a group of one rank (every op is then a local copy).
  // slot (0..7) separates the ring tags of groups that share one pg.
  // native_reduce_scatter: Gloo's own reduce-scatter instead of our ring
  // (CommOptions::gloo_native_reduce_scatter).
  GlooGroup(std::string name, std::vector<int> global_ranks, int rank,
            c10::intrusive_ptr<c10d::Backend> pg, int slot, bool native_reduce_scatter = false);
  ~GlooGroup() override;

  const std::string& name() const override { return name_; }
  const std::string& backend() const override {
    static const std::string kGloo = "gloo";
    return kGloo;
  }
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }
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

  const c10::intrusive_ptr<c10d::Backend>& pg() const { return pg_; }

 private:
  // Wraps a queued Gloo op; waits now unless async. `finish` runs after.
  WorkPtr gloo_work(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish,
                    const char* op, bool async);
  // The ring: in [n*m] (fp32 or fp16), out [m]; runs on ring_thread_.
  void ring_reduce_scatter(const at::Tensor& in, at::Tensor& out, uint32_t seq);
  int ring_tag(uint32_t seq, int step) const;
  void check(const at::Tensor& t, const char* op) const;

  std::string name_;
  std::vector<int> global_ranks_;
  int rank_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  int slot_;
  bool native_reduce_scatter_;
  uint32_t ring_seq_ = 0;  // ring ops issued (same order on every member)
  std::atomic<uint64_t> bytes_{0};
  TaskThread ring_thread_;
};

}  // namespace dtrain::engine::comm::detail
