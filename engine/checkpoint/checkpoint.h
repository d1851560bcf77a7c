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

#include "common/checkpoint_writer.h"
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
  double write_seconds = 0;  // of which writing this rank's file
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
// a warning, so `latest` stays on finite state. With checkpoint.async it
// starts the save (async_save.cpp) and commits one whose writes have all
// finished; the last step and preemption wait for the write and commit.
// What it did is the same on every rank.
struct StepSave {
  bool stop = false;      // the loop must stop now (preempted)
  double block_ms = -1;   // the step loop was stopped this long for checkpoints (-1: no save work)
  double write_ms = -1;   // a rank file was written in this long: this step's save when
                          // synchronous, the one committed at this step when async (the longer
                          // when the last step commits two) (-1: none)
};
StepSave after_step(const TrainState& s, int64_t steps_done, bool step_finite);

// The pieces of save(), shared with the asynchronous save.
namespace detail {
struct PreparedSave {
  int64_t step = 0;
  std::string dir, file;                    // step_<N>.tmp and rank_<r>.safetensors
  std::vector<at::Tensor> keep;             // host copies the shards point into
  std::vector<dtrain::checkpoint::ShardData> shards;
  dtrain::checkpoint::Index index;          // rank 0: the header as of `step`
  safetensors::WriteOptions options;        // the crash_during_save fault
};
// Collective: the finiteness check, step_<N>.tmp made, host copies taken
// (`copy`: never aliasing live CPU tensors, for a write that overlaps training).
PreparedSave prepare_save(const TrainState& s, int64_t step, bool copy);
// This rank's file; no collective (safe on a background thread).
uint64_t write_prepared(PreparedSave& p);
// Collective: barrier, rank 0's index.json and commit, barrier.
void commit_prepared(const TrainState& s, PreparedSave& p);
}  // namespace detail

// Asynchronous saves (at most one in flight per process). start_async_save
// waits for (and commits) a save still in flight, then prepares `step`'s
// and hands the write to a background thread. finish_async_save is
// collective: with `wait` it joins the writer; without, it commits only when
// every rank's write is done (one all-reduce per call while a save is in
// flight). Both return the write time in ms of the save they committed
// (-1: none). A writer's I/O error throws dtrain::Error(checkpoint) on every rank.
double start_async_save(const TrainState& s, int64_t step);
double finish_async_save(const TrainState& s, bool wait);
bool async_save_in_flight();

}  // namespace dtrain::engine::checkpoint
