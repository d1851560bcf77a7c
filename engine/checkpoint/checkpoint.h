// Engine side of sharded checkpoints (docs/ARCHITECTURE.md, 'Checkpoints'):
// what one rank saves (the model and optimizer entries its layout's
// StateProvider gives it, every rank's RNG states) and how a rank loads its
// part back through the index, from any mesh. Also preemption (SIGTERM ->
// checkpoint, exit 0); the chaos-testing faults of the spec's fault section are
// in fault.h. Format and directory protocol: common/checkpoint_*.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <future>
#include <memory>
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

// The SIGTERM poll of one run (preemption_requested): the flag's
// all-reduce in flight on the run's control group. The run's, not the
// process's: a worker recovering in place (cluster.recover_in_place) trains
// its next round in the same process, and a round that ended between a
// poll's start and its wait left that all-reduce failed with the round's
// sockets (waited in the next round, it failed that round at its first step).
struct PreemptionPoll {
  at::Tensor flag;  // [1]
  comm::WorkPtr work;
};

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
  PreemptionPoll* preemption = nullptr;  // the run's SIGTERM poll (after_step; the trainer's session)
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
// it returns the flags as of the previous step (`poll`'s), and starts the
// poll of this one unless `last`. So a stop comes at most two steps after the
// signal; cluster.grace_s must cover two steps and a save.
void install_preemption_handler();
bool preemption_requested(comm::Group& control, PreemptionPoll& poll, bool last);

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
// takes the save's host copies and hands the rest to the writer thread
// (async_save.cpp), and reports a save the writers have committed; the last
// step and preemption wait for the write and commit. Which saves it starts
// and waits for is the same on every rank; the step at which a background
// commit is reported is rank 0's.
struct StepSave {
  bool stop = false;      // the loop must stop now (preempted)
  double block_ms = -1;   // the step loop was stopped this long for checkpoints and in-memory
                          // copies (memory_snapshot.h): their host copies and waits (-1: no save work)
  double write_ms = -1;   // a rank file was written in this long: this step's save when
                          // synchronous, the one committed at this step when async (the longer
                          // when the last step commits two) (-1: none)
  double memory_copy_ms = -1;  // an in-memory copy's background time (write, send, barrier),
                               // reported at the step its writer is found finished (-1: none)
};
StepSave after_step(const TrainState& s, int64_t steps_done, bool step_finite);
// Training thread, before anything changes the state (the gradient sync's
// finish, the optimizer): waits for the host copies of a checkpoint or
// in-memory copy still being taken in the background (a state whose
// StateProvider is stable_until_optimizer, on a CPU, is copied while the
// next step's forward and backward run). Returns the milliseconds waited:
// the step loop stopped for a checkpoint, not the step's own time.
double wait_for_host_copies();

// The pieces of save(), shared with the asynchronous save.
namespace detail {
struct PreparedSave {
  int64_t step = 0;
  std::string dir, file;                    // step_<N>.tmp and rank_<r>.safetensors
  std::vector<at::Tensor> keep;             // host copies the shards point into
  std::vector<dtrain::checkpoint::ShardData> shards;
  dtrain::checkpoint::Index index;          // rank 0: the header as of `step`
  safetensors::WriteOptions options;        // the crash_during_save fault
  // Valid when the host copies are being taken in the background (they are
  // complete once it is ready; its get() rethrows a failed copy): every
  // reader of `keep` waits for it (wait_copied).
  std::shared_future<void> copied;
};
// Blocks until p's host copies are complete (at once when they were taken in place).
void wait_copied(const PreparedSave& p);
// Collective: the finiteness check, step_<N>.tmp made, host copies taken
// (`copy`: never aliasing live CPU tensors, for a write that overlaps training).
PreparedSave prepare_save(const TrainState& s, int64_t step, bool copy);
// The host copies alone (never aliasing live tensors) and rank 0's index
// header: no collective, nothing made on disk.
PreparedSave take_snapshot(const TrainState& s, int64_t step);
// The first of the copies' floating-point tensors holding a NaN or inf ("": none).
std::string first_nonfinite_copy(const PreparedSave& p);
// This rank's file; no collective (safe on a background thread).
uint64_t write_prepared(PreparedSave& p);
// Collective: barrier, rank 0's index.json and commit, barrier.
void commit_prepared(const TrainState& s, PreparedSave& p);
// What a save of `step` holds, without the save protocol (the in-memory
// copies of memory_snapshot.h): this rank's shards (host copies in `keep`,
// aliasing live CPU tensors) and the index header (no tensors yet).
std::vector<dtrain::checkpoint::ShardData> rank_shards(const TrainState& s, std::vector<at::Tensor>& keep);
dtrain::checkpoint::Index index_of(const TrainState& s, int64_t step);
}  // namespace detail

// Asynchronous saves (async_save.cpp; at most one in flight per process).
// The training thread only takes host copies; a writer thread per rank then
// checks them, writes its file and commits with the other ranks' writers
// over a Gloo group of their own (AsyncSaveScope's; barriers, rank 0's
// index.json, rename, latest), so no collective of the save runs on the
// training thread.
// start_async_save: waits for a save still in flight (and throws its
// failure), then takes `step`'s copies and starts the writer; returns the
// write time in ms of a save it waited for (-1: none). poll_async_save: no
// collective; the write time of a save this rank's writer has finished
// since (-1: none), its failure thrown. finish_async_save: waits for the
// save in flight; its write time (-1: none), its failure thrown. `host`:
// step's copies taken already (take_snapshot; shared with the in-memory
// copy of the same step), moved from. The
// writers agree on a save's outcome, so a failure (an I/O error, or
// non-finite state: then nothing is written) throws dtrain::Error on every
// rank, and `latest` stays on the previous checkpoint. An I/O failure (a
// full disk) met while training goes on (start_async_save's wait, the poll)
// is logged and training goes on with the next save, unless it is the
// kMaxFailedSaves-th in a row; the wait at the end of training and on
// SIGTERM (finish_async_save) throws every failure.
inline constexpr int kMaxFailedSaves = 3;
double start_async_save(const TrainState& s, int64_t step, detail::PreparedSave* host = nullptr);
double poll_async_save(const TrainState& s);
double finish_async_save(const TrainState& s);
bool async_save_in_flight();

// Made by the trainer after its process groups, on every rank (collective
// when checkpoint.async is on: it makes the writers' Gloo group over the
// world, comm/side_group.h), and destroyed before them: a writer still in
// flight when the run ends, by an exception too, finishes (or fails with its
// peers) before its group and the groups' store are torn down.
class AsyncSaveScope {
 public:
  AsyncSaveScope(comm::Comm& comm, const JobSpec& spec);
  AsyncSaveScope(const AsyncSaveScope&) = delete;
  AsyncSaveScope& operator=(const AsyncSaveScope&) = delete;
  ~AsyncSaveScope();

 private:
  std::unique_ptr<comm::Group> writers_;  // null without checkpoint.async
};

}  // namespace dtrain::engine::checkpoint
