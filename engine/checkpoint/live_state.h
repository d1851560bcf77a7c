// Recovery from the survivors' live state (cluster.live_recovery): a worker
// whose round ends under it (recovery in place) keeps the model and optimizer
// state it trained, in this process, at the last step it completed; the next
// round takes its state from the survivors instead of a copy or a checkpoint:
// a rank that kept the newest step copies it in place, the others receive it
// from the lowest such rank, point to point. No step is redone (a copy or a
// checkpoint is some steps older) and nothing is read from memory copies or
// disk. Only where every rank of both rounds holds the whole state (pure data
// parallel: DDP, no tensor, pipeline, expert or context parallelism, no ZeRO,
// no offload) on the CPU; elsewhere restores go on as before (memory copies,
// disk). The RNG states are not carried: training draws none (dropout is
// counter-based, engine/random), and a restore's only serve a later save.
#pragma once

#include <cstdint>

#include "engine/checkpoint/checkpoint.h"

namespace dtrain::engine::checkpoint {

// Keeps `s`'s state after `steps_done` steps (`steps_recorded` of them with
// their metrics recorded) for the next round of this process, replacing any
// kept before; nothing when the layout does not hold
// the whole state on this rank, off the CPU, or with cluster.live_recovery
// false. Holds references to the tensors (no copy): the session may go.
// Never throws (called while a round's exception unwinds the trainer).
void keep_live_state(const TrainState& s, int64_t steps_done, int64_t steps_recorded) noexcept;

// Collective over s.control, at a restore. Restores the newest step some
// rank kept when every rank's layout holds the whole state, that step is
// not older than `disk_step` (-1: none), some rank that kept it recorded its
// metrics and a kept rank 0 (the writer of metrics.jsonl) did too (else the
// round ended in the step's logging collectives, and its line may never have
// been written: the copies, older, redo the step): returns it; else -1.
// Either way this process's kept state is dropped (a later round must not
// take a step of a timeline it did not train on).
int64_t restore_from_live(const TrainState& s, int64_t disk_step);

}  // namespace dtrain::engine::checkpoint
