// train.offload.optimizer: host's update, as ZeRO-Offload's CPU Adam: fp32
// master weights and AdamW's moments in host memory (pinned under a GPU),
// each bucket's gradients copied to the host ahead of its update, the
// updated master copied back into the parameters. Owns the master and the
// gradient staging buffers and the order of the copies; not the moments
// (OffloadStore) nor the update's arithmetic (adamw_kernel.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/optim/adamw_kernel.h"
#include "engine/optim/offload_store.h"

namespace dtrain::engine::optim {

class HostUpdate {
 public:
  // params: the optimizer's, contiguous, on one device (a GPU; the CPU
  // under the test override: the same copies, done synchronously).
  // no_copy_back: fault.kind offload_no_writeback, the updated master never
  // reaches the parameters.
  // threads: how many threads run each bucket's update (1: the caller
  // alone); each takes a contiguous range of the bucket's elements, and every
  // element's arithmetic is the same, so any count gives the same bits.
  HostUpdate(const OffloadStore& store, const std::vector<at::Tensor>& params, bool pinned, bool no_copy_back,
             int threads = 1);
  ~HostUpdate();
  HostUpdate(const HostUpdate&) = delete;
  HostUpdate& operator=(const HostUpdate&) = delete;

  struct StepArgs {
    std::function<at::Tensor(size_t)> grad;                 // param i's gradient; undefined: skipped
    std::function<kernel::AdamWScalars(size_t)> scalars;  // param i's constants for this step
    std::function<void(int64_t)> page;                     // param i's storage in memory (-1: done)
  };
  // One update of every bucket: bucket b + 1's gradients are copied while b
  // is updated, and b's master is copied back while b + 1 is. Under a GPU
  // the copies run on a stream of their own; the caller's stream waits for
  // the last one before its next kernel, so the next forward sees the
  // update and the copies back overlap its launch.
  void step(OffloadStore& store, std::vector<at::Tensor>& params, const StepArgs& args);
  // Host bytes: the master and the two gradient staging buffers.
  int64_t bytes() const;
  // Since the last call: io_s the copies (issuing them under a GPU), wait_s
  // the CPU blocked on a bucket's gradients, update_s the update itself.
  OffloadIo take_stats();

 private:
  struct Streams;  // the copy stream and its events (none on a CPU)
  class Crew;     // the threads beside the caller's that share each bucket's update
  void refresh_master(std::vector<at::Tensor>& params, const StepArgs& args);
  void grads_in(const OffloadStore& store, int b, const StepArgs& args);
  void wait_grads(int b);

  at::Tensor master_;           // [sum of numel]: the parameters, in the store's element order
  std::vector<int64_t> first_;  // param i's first element in master_
  // Each parameter's version counter when the master last matched it: a
  // write by anyone else (initialisation, a checkpoint load) moves it, and
  // the next step reads that parameter into the master first.
  std::vector<int64_t> version_;
  at::Tensor staging_[2];  // bucket b's gradients in staging_[b % 2]
  bool no_copy_back_ = false;
  std::unique_ptr<Streams> streams_;
  std::unique_ptr<Crew> crew_;
  int64_t copy_ns_ = 0, wait_ns_ = 0, update_ns_ = 0;
};

}  // namespace dtrain::engine::optim
