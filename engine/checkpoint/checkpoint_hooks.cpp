// The trainer hooks of checkpoint.h: resume at start, and after each step
// the periodic / final / preemption save. Kept apart from checkpoint.cpp,
// which is the save and load mechanics.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/log.h"
#include "common/timeline.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/live_state.h"
#include "engine/checkpoint/resume_fallback.h"
#include "engine/checkpoint/memory_snapshot.h"

namespace dtrain::engine::checkpoint {

namespace {
// <root>/step_<N> -> N
int64_t disk_step(const std::string& dir) {
  const auto at = dir.rfind("step_");
  return at == std::string::npos ? -1 : std::atoll(dir.c_str() + at + 5);
}
}  // namespace

int64_t resume(const TrainState& s) {
  install_preemption_handler();
  std::string dir = prepare_resume(s);
  // An explicit `dtrain resume` reads its checkpoint; a re-formed round the
  // newest state the nodes hold in memory, unless disk has a newer one.
  const bool explicit_first = !s.info->resume_from.empty() && s.info->restart == 0;
  const bool memory = !explicit_first && memory_copies_on(s);
  if (!explicit_first) {  // a round after one that ended under its workers: the survivors' own state
    const int64_t step = restore_from_live(s, dir.empty() ? -1 : disk_step(dir));
    if (step >= 0) {
      if (s.info->rank == 0 && !dir.empty()) verify_in_background(dir);
      return step;
    }
  }
  if (explicit_first) {
    dir = dtrain::checkpoint::resolve(s.info->resume_from);  // a corrupt one is refused by load
  } else if (!dir.empty()) {
    // Memory first: a copy at least as new as `latest` needs no disk read
    // (rank 0 verifying every shard of `latest` held up every rank's
    // restart); `latest` is verified after, off the restart's path.
    if (memory) {
      const int64_t step = restore_from_memory(s, disk_step(dir));
      if (step >= 0) {
        if (s.info->rank == 0) verify_in_background(dir);
        return step;
      }
    }
    // Past a corrupt `latest` to the newest that verifies, unless begun
    // explicitly; memory again when that one is older than `latest`.
    const std::string verified = newest_verified(s, dir, /*fall_back=*/s.info->resume_from.empty());
    if (memory && verified != dir) {
      const int64_t step = restore_from_memory(s, disk_step(verified));
      if (step >= 0) return step;
    }
    dir = verified;
  } else if (memory) {
    const int64_t step = restore_from_memory(s, -1);
    if (step >= 0) return step;
  }
  if (dir.empty() && !s.info->init_from.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    load(s, s.info->init_from, /*weights_only=*/true);
    if (s.info->rank == 0)
      DTRAIN_INFO("initialised the model from {} (weights only; fresh optimizer and sampler) in {:.3f} s",
                  s.info->init_from,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return 0;
  }
  if (dir.empty()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t step = load(s, dir);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (s.info->rank == 0) {
    uint64_t bytes = 0;  // what this rank read: model + AdamW state
    for (const auto& e : s.state->load_entries()) bytes += uint64_t(e.tensor.nbytes());
    DTRAIN_INFO("resuming from step {} ({}, sampler at {} samples): loaded {:.1f} MB in {:.3f} s ({:.0f} MB/s)",
                step, dir, s.sampler->state().consumed, double(bytes) / 1e6, secs,
                double(bytes) / 1e6 / (secs > 0 ? secs : 1e-9));
  }
  return step;
}

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The synchronous save of step `steps_done`; returns its write time in ms.
double save_now(const TrainState& s, int64_t steps_done, bool preempted) {
  SaveStats st;
  {
    timeline::Scope span(timeline::Kind::checkpoint);
    st = save(s, steps_done);
  }
  if (s.info->rank == 0)
    DTRAIN_INFO("checkpoint {} saved{}: {:.1f} MB from rank 0 in {:.3f} s ({:.0f} MB/s)", st.dir,
                preempted ? " on SIGTERM" : "", double(st.bytes) / 1e6, st.seconds,
                double(st.bytes) / 1e6 / (st.seconds > 0 ? st.seconds : 1e-9));
  return st.write_seconds * 1e3;
}

// The in-memory copy of step `steps_done` (when due) and the poll of the one
// in flight. Sets out.memory_copy_ms; returns whether it did copy work
// (block_ms is reported).
bool memory_copy_work(const TrainState& s, int64_t steps_done, bool due, detail::PreparedSave* host, StepSave& out) {
  bool worked = false;
  if (memory_copy_in_flight()) {  // no collective: has this rank's writer finished?
    out.memory_copy_ms = poll_memory_copy();
    worked = out.memory_copy_ms >= 0;
  }
  if (due) {  // before the fault hooks: a hang after step N still lets N's copy complete
    timeline::Scope span(timeline::Kind::checkpoint);
    out.memory_copy_ms = std::max(out.memory_copy_ms, start_memory_copy(s, steps_done, host));
    worked = true;
  }
  if (due && memory_copy_sync()) {
    out.memory_copy_ms = std::max(out.memory_copy_ms, finish_memory_copy());
  }
  return worked;
}

// The disk save of step `steps_done` (when due: synchronous, or started in
// the background) and the poll of an async one in flight; the last step and
// preemption wait for the write and commit it. Sets out.write_ms; returns
// whether it did save work (block_ms is reported).
bool disk_save_work(const TrainState& s, int64_t steps_done, bool due, bool step_finite, bool preempted,
                    detail::PreparedSave* host, StepSave& out) {
  const auto& c = s.spec->checkpoint;
  bool worked = false;
  if (c.async && async_save_in_flight()) {  // no collective: has this rank's writer finished?
    out.write_ms = poll_async_save(s);
    worked = out.write_ms >= 0;
  }
  if (due && !step_finite) {
    if (s.info->rank == 0) {
      const std::string latest = dtrain::checkpoint::latest_dir(c.dir);
      DTRAIN_WARN("checkpoint of step {} not written: the step was not finite; {}", steps_done,
                  latest.empty() ? "no checkpoint exists yet" : "latest stays " + latest);
    }
  } else if (due && c.async) {
    timeline::Scope span(timeline::Kind::checkpoint);
    out.write_ms = std::max(out.write_ms, start_async_save(s, steps_done, host));
    worked = true;
  } else if (due) {
    out.write_ms = save_now(s, steps_done, preempted);
    worked = true;
  }
  if (c.async && async_save_in_flight() && (preempted || steps_done >= s.spec->train.steps)) {
    timeline::Scope span(timeline::Kind::checkpoint);
    out.write_ms = std::max(out.write_ms, finish_async_save(s));
    worked = true;
  }
  return worked;
}

}  // namespace

StepSave after_step(const TrainState& s, int64_t steps_done, bool step_finite) {
  if (s.preemption == nullptr)
    throw Error(ErrorCode::internal, "checkpoint::after_step without the run's SIGTERM poll",
                "the trainer's TrainState points at its session's PreemptionPoll");
  StepSave out;
  out.stop = preemption_requested(*s.control, *s.preemption, steps_done >= s.spec->train.steps);
  const bool preempted = out.stop;
  const bool last = steps_done >= s.spec->train.steps;
  const auto& c = s.spec->checkpoint;
  const bool due = !c.dir.empty() && ((c.every > 0 && steps_done % c.every == 0) || last || preempted);
  // No copy at the last step or on SIGTERM: the agent removes the copies when
  // the job stops, and the disk save comes first within cluster.grace_s.
  const bool copy_due =
      step_finite && memory_copies_on(s) && !preempted && !last && steps_done % c.memory_every == 0;
  const auto t0 = std::chrono::steady_clock::now();
  // One step's host copies serve both writers when an async save and a copy fall on it.
  std::optional<detail::PreparedSave> host;
  if (copy_due && due && step_finite && c.async) {
    timeline::Scope span(timeline::Kind::checkpoint);
    host = detail::take_snapshot(s, steps_done);
  }
  bool worked = memory_copies_on(s) && memory_copy_work(s, steps_done, copy_due, host ? &*host : nullptr, out);
  // The end of training and preemption wait for the copy in flight, after the
  // disk save (its failure is thrown; nothing outlives the run).
  const auto finish_copy = [&] {
    if (!memory_copy_in_flight() || !(preempted || last)) return;
    timeline::Scope span(timeline::Kind::checkpoint);
    out.memory_copy_ms = std::max(out.memory_copy_ms, finish_memory_copy());
    worked = true;
  };
  if (c.dir.empty()) {
    if (preempted && s.info->rank == 0)
      DTRAIN_WARN("SIGTERM: stopping after step {} without a checkpoint (checkpoint.dir is empty)", steps_done);
    finish_copy();
    if (worked) out.block_ms = ms_since(t0);
    return out;
  }
  worked = disk_save_work(s, steps_done, due, step_finite, preempted, host ? &*host : nullptr, out) || worked;
  finish_copy();
  if (worked) out.block_ms = ms_since(t0);
  fault_after_step(s.spec->fault, *s.info, steps_done);  // after the step's checkpoint, if one was due
  if (preempted && s.info->rank == 0)
    DTRAIN_INFO("preempted: stopping after step {}; `dtrain resume --ckpt {}` continues", steps_done, c.dir);
  return out;
}

}  // namespace dtrain::engine::checkpoint
