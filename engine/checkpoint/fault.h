// Chaos testing: the spec's fault section (common/job_spec.h FaultSpec) acted
// out by the engine, on the first launch only (DTRAIN_RESTART = 0), by rank
// fault.rank. Steps are numbered from 1, as in metrics.jsonl. Not here:
// the layout faults no_grad_sync, no_tp_reduce and no_pp_grad (options that
// engine/parallel/parallelize.cpp sets), reset_moments_on_load (load, in
// checkpoint.cpp) and the announcement (a warning on every rank at start-up).
#pragma once

#include <cstdint>

#include "common/job_spec.h"
#include "engine/comm/comm.h"

namespace dtrain::engine::checkpoint {

// fault.kind slow: sleeps fault.ms milliseconds in every step from step
// fault.step on. Called inside the timed part of step `step`, so step_s
// shows it (and the other ranks wait for it at the step's collectives).
// fault.kind raise: throws std::runtime_error in step fault.step.
void fault_in_step(const FaultSpec& f, const comm::WorldInfo& info, int64_t step);

// fault.kind nan_grad: true in step fault.step on rank fault.rank, whose
// backward then scales its loss by NaN (NaN gradients, as from a bad batch).
bool nan_grad_in_step(const FaultSpec& f, const comm::WorldInfo& info, int64_t step);

// After step `step` and its checkpoint, if one was due: kill_after_step
// SIGKILLs this rank; hang sleeps forever (SIGTERM only sets the preemption
// flag, so the launcher's SIGKILL after cluster.grace_s ends it), when
// `step` is fault.step.
void fault_after_step(const FaultSpec& f, const comm::WorldInfo& info, int64_t step);

// crash_during_save: true when this rank must die halfway through writing
// its shard of step `step`'s checkpoint (fault.step 0: the first save).
bool crash_during_save(const FaultSpec& f, const comm::WorldInfo& info, int64_t step);

}  // namespace dtrain::engine::checkpoint
