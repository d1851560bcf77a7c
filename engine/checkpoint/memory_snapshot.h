// In-memory checkpoint copies (checkpoint.memory): every `every` steps each
// rank writes the state a checkpoint holds into its node's RAM directory
// (DTRAIN_MEMORY_DIR, made and removed by the agent) and sends a copy to the
// rank of the same local index on each of the next `replicas` nodes; a
// re-formed round restores from them before disk. Not here: the disk
// checkpoints (checkpoint.h), the directory's lifetime (launcher/memory_copies.h).
#pragma once

#include <cstdint>
#include <string>

#include "engine/checkpoint/checkpoint.h"

namespace dtrain::engine::checkpoint {

// Whether this job keeps copies: checkpoint.memory on, more than one node,
// and the agent gave a directory.
bool memory_copies_on(const TrainState& s);

// Collective over the world, after step `step`: this rank's state as
// <dir>/step_<step>/rank_<r>.safetensors on its node and on the peers',
// then a barrier, then older steps are dropped (a step is complete on every
// node before the one before it goes). Returns the time it took in ms.
double memory_snapshot(const TrainState& s, int64_t step);

// Collective at start-up: the newest step not older than `disk_step` (-1:
// no checkpoint on disk) of which some surviving node holds every old rank's
// shard is gathered, presented as a checkpoint directory in this node's
// memory and loaded (any mesh, as from disk). Rank 0 logs where each shard
// came from. Returns the step, or -1 when memory holds no such step (disk
// is then the fallback, and rank 0 says which shards were missing).
int64_t restore_from_memory(const TrainState& s, int64_t disk_step);

}  // namespace dtrain::engine::checkpoint
