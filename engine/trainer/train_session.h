// Everything one rank's training loop holds, built in a fixed order from the
// environment contract and the resolved spec: comm, data, sampler, model,
// parallelize (model parts, gradient sync, schedule), optimizer, LR schedule.
// Owns set-up and the checks of what this engine supports; the loop itself
// lives in trainer.cpp. Names no parallelism: parallel/parallelize.h does.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/comm/comm.h"
#include "engine/data/dataset.h"
#include "engine/data/sampler.h"
#include "engine/optim/adamw.h"
#include "engine/parallel/parallelize.h"
#include "engine/parallel/schedule.h"
#include "engine/trainer/metrics.h"
#include "engine/trainer/mfu.h"

namespace dtrain::engine::trainer {

struct TrainSession {
  comm::WorldInfo info;
  JobSpec spec;
  c10::Device device = c10::Device(c10::DeviceType::CPU);  // cpu, or cuda:LOCAL_RANK
  std::unique_ptr<comm::Comm> comm;
  comm::Group* dp = nullptr;  // the data-parallel group of this rank
  std::unique_ptr<data::TokenDataset> data;
  std::unique_ptr<data::DistributedSampler> sampler;
  parallel::Parallelized par;  // model parts, grad_sync, schedule
  std::unique_ptr<optim::AdamW> optimizer;
  std::unique_ptr<parallel::StateProvider> state;  // the checkpoint's view of par + optimizer
  optim::LrSchedule schedule;
  at::Tensor inputs, targets;     // [micro_batch, T] int64 on the CPU (pinned with a GPU)
  at::Tensor inputs_dev, targets_dev;  // the same on `device` (== inputs/targets on the CPU)
  DevicePeak peak;             // the ranks' measured matmul peak (MFU's denominator)
  double flops_per_step = 0;   // model FLOPs of one step (MFU's numerator, per step)
  int64_t model_params = 0;    // the whole model's, before any split
  // The weights were not drawn: a restore was expected to overwrite them
  // all (make_train_session's skip_init_if_restoring).
  bool init_skipped = false;
  // The optimizer state, parameters and sampler are those after
  // `steps_applied` steps (false while a restore or an update changes them):
  // what a round that ends under the loop keeps (checkpoint/live_state.h).
  bool state_settled = false;
  int64_t steps_applied = 0;
  int64_t steps_recorded = 0;  // steps whose metrics this rank recorded (rank 0 writes them)
  // This run's SIGTERM poll, its all-reduce in flight on comm's control
  // group: a run after a round abort starts with none (checkpoint.h).
  checkpoint::PreemptionPoll preemption;

  bool is_log_rank() const { return info.rank == 0; }
  MemoryStats memory() const;  // peak: measured_peak_bytes()

  TrainSession() = default;
  TrainSession(const TrainSession&) = delete;
  TrainSession& operator=(const TrainSession&) = delete;
  // After a round abort, or while an exception unwinds the trainer
  // (comm::leaving_round), the groups are leaked, not destroyed: their
  // sockets are shut down or reset under pending work, and a destructor that
  // waits for that work must not hold up the next round.
  ~TrainSession();
};

// Reads WorldInfo and DTRAIN_SPEC, sets one intra-op thread, picks the
// device (cuda:LOCAL_RANK for cluster.device cuda), builds the groups
// (collective) and everything else. Throws dtrain::Error(config) for the combinations
// this engine does not run (plan/combinations.h: ZeRO-3 or MoE with pp, fp16, ...).
// `skip_init_if_restoring`: where every rank expects to restore a checkpoint
// or in-memory copy (one on disk, `dtrain resume`, a restarted round with
// checkpoint.memory), the initial weights are not drawn nor broadcast
// (init_skipped); a caller whose restore then loads nothing calls
// rebuild_drawn before training.
std::unique_ptr<TrainSession> make_train_session(bool skip_init_if_restoring = false);

// The model, layout, optimizer and state of `s` built again with the weights
// drawn from job.seed (collective over the layout's groups).
void rebuild_drawn(TrainSession& s);

// fault.kind offload_truncate / offload_delete: rank fault.rank truncates
// or deletes its train.offload file after step fault.step (first launch).
void offload_fault_after_step(TrainSession& s, int64_t steps_done);

// The step's measured peak (MemoryStats::peak): the counting allocator's
// peak plus this rank's shared-memory buffers (comm::shm_buffer_bytes).
int64_t measured_peak_bytes();

}  // namespace dtrain::engine::trainer
