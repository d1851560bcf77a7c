// Engine side of sharded checkpoints (docs/ARCHITECTURE.md, 'Checkpoints'):
// what one rank saves (the model and optimizer entries its layout's
// StateProvider gives it, every rank's RNG states) and how a rank loads its
// part back through the index, from any mesh. Also preemption (SIGTERM ->
// checkpoint, exit 0); the chaos-testing faults of the spec's fault section are
// in fault.h. Format and directory protocol: common/checkpoint_*.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "engine/checkpoint/fault.h"  // the trainer calls fault_in_step
#include "engine/comm/comm.h"
#include "engine/data/sampler.h"
#include "engine/optim/adamw.h"
#include "engine/parallel/grad_sync.h"

namespace dtrain::engine::checkpoint {

// The training state a checkpoint holds, as references into the trainer's
// objects (nothing is owned).
struct TrainState {
  const JobSpec* spec = nullptr;
  const comm::WorldInfo* info = nullptr;
  comm::Group* control = nullptr;  // barriers of the save protocol (Gloo, CPU, world)
  parallel::StateProvider* state = nullptr;  // model + optimizer tensors, and who writes which
  optim::AdamW* optimizer = nullptr;         // its step count
  data::DistributedSampler* sampler = nullptr;
  const optim::LrSchedule* schedule = nullptr;
  c10::Device device = c10::Device(c10::DeviceType::CPU);  // where params live; its RNG is saved too
};

struct SaveStats {
  std::string dir;         // the committed step_<N>
  uint64_t bytes = 0;      // this rank's tensor bytes
  double seconds = 0;      // wall time of the whole collective save
};

// "gpt vocab=256 layers=2 d_model=64 heads=4 seq_len=64": what must match
// for a checkpoint to load (dropout, batch and mesh may change).
std::string model_signature(const ModelSpec& m);

// Rank 0 removes leftover step_<N>.tmp of checkpoint.dir, then a world
// barrier. Returns the checkpoint to resume from ("" when none).
std::string prepare_resume(const TrainState& s);

// Collective over the world: every rank writes rank_<r>.safetensors into
// step_<step>.tmp, rank 0 writes index.json after a barrier and commits
// (rename, latest, keep). Before anything is written, every rank checks
// that its model and optimizer tensors are finite: when one is not, no rank
// writes and all throw dtrain::Error(config). Throws dtrain::Error(checkpoint)
// on I/O failures.
SaveStats save(const TrainState& s, int64_t step);

// Loads this rank's state from checkpoint dir `dir` (any mesh) after
// checking the model matches; returns the step it holds. RNG: the state of
// the same global rank when the checkpoint has it, else a fresh seed from
// (job.seed, rank, step) -- ranks that did not exist have no stream to continue.
// weights_only (or a checkpoint whose index says weights_only, e.g. a
// Hugging Face import): the model's tensors alone, matched by name and shape
// (not by signature: seq_len and dropout may differ); optimizer, sampler and
// RNG stay as a fresh run has them, and it returns 0.
int64_t load(const TrainState& s, const std::string& dir, bool weights_only = false);

// Loads only the model's tensors of checkpoint dir `dir` (any mesh) into
// this rank's parameters, after the same model check as load; the
// optimizer, sampler and RNG states are left as they are (evaluation).
// Returns the step the checkpoint holds.
int64_t load_model(const TrainState& s, const std::string& dir);

// SIGTERM sets a flag instead of killing: the trainer finishes the step,
// saves and exits 0. preemption_requested is collective over `world`, once
// after every step (any rank's signal stops every rank after the same step):
// it returns the flags as of the previous step, and starts the poll of this
// one unless `last`. So a stop comes at most two steps after the signal;
// cluster.grace_s must cover two steps and a save.
void install_preemption_handler();
bool preemption_requested(comm::Group& control, bool last);

// The trainer's two hooks.
// resume: installs the SIGTERM handler, cleans leftover .tmp, and loads
// WorldInfo::resume_from (DTRAIN_RESUME_FROM, set by `dtrain resume`; first
// launch only) or else
// checkpoint.dir's `latest`; returns the step to continue from (0: none).
// With nothing to resume, WorldInfo::init_from (train.init_from) is loaded
// weights only, and the run starts at step 0.
int64_t resume(const TrainState& s);
// after_step: saves every checkpoint.every steps, after the last step and
// on preemption (collective), except after a step that was not finite
// (`step_finite` false, the same on every rank): that save is left out with
// a warning, so `latest` stays on finite state. Returns true when the loop
// must stop now.
bool after_step(const TrainState& s, int64_t steps_done, bool step_finite);

}  // namespace dtrain::engine::checkpoint
