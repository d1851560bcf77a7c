// In-memory checkpoint copies (checkpoint.memory): every `every` steps each
// rank writes the state a checkpoint holds into its node's RAM directory
// (DTRAIN_MEMORY_DIR, made and removed by the agent) and sends a copy to the
// rank of the same local index on each of the next `replicas` nodes; a
// re-formed round restores from them before disk. Not here: the disk
// checkpoints (checkpoint.h), the directory's lifetime (launcher/memory_copies.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint/checkpoint.h"

namespace dtrain::engine::checkpoint {

// Whether this job keeps copies: checkpoint.memory on, more than one node,
// and the agent gave a directory.
bool memory_copies_on(const TrainState& s);

// Background copies (memory_copy.cpp; at most one in flight per process).
// start_memory_copy: on the training thread after step `step`, on every rank
// at the same step. Waits for the copy still in flight (rank 0 says how
// long; its failure is thrown), takes this rank's host copies (or shares
// `host`'s: an async disk save's copies of the same step) and hands the rest
// to this rank's copy writer: <dir>/step_<step>.<id>/rank_<r>.safetensors on its
// node and on the peers', sent over the writers' own Gloo group
// (MemoryCopyScope's), then the writers' barrier, then older steps are
// dropped. So an older step goes only when the newer one is complete on
// every node, and a restore takes a step only when every old rank's shard of
// it is held somewhere (restore_from_memory). The first call per world
// gathers the node layout over the world (collective). Returns the
// background time in ms of a copy it waited for (-1: none).
// poll_memory_copy: no collective; the background time of a copy this
// rank's writer has finished since (-1: none), its failure thrown.
// finish_memory_copy: waits for the copy in flight; its time (-1: none).
double start_memory_copy(const TrainState& s, int64_t step, const detail::PreparedSave* host);
double poll_memory_copy();
double finish_memory_copy();
bool memory_copy_in_flight();
// DTRAIN_MEMORY_COPY_SYNC=1: after_step waits for each copy at once (the
// copy back on the blocking path; benchmarks and tests compare with it).
bool memory_copy_sync();

// Made by the trainer after its process groups, on every rank (collective
// when copies are on: it makes the copy writers' Gloo group over the world)
// and destroyed before them: a copy still in flight when the run ends (an
// exception, a round ended by recovery in place, whose socket shutdown makes
// the writer's Gloo ops throw at once) is joined, never left running.
class MemoryCopyScope {
 public:
  MemoryCopyScope(comm::Comm& comm, const JobSpec& spec);
  MemoryCopyScope(const MemoryCopyScope&) = delete;
  MemoryCopyScope& operator=(const MemoryCopyScope&) = delete;
  ~MemoryCopyScope();

 private:
  std::unique_ptr<comm::Group> writers_;  // null without copies
};

// The copy's two halves, shared by memory_copy.cpp and memory_snapshot.cpp.
namespace detail {
struct MemoryCopy {
  int64_t step = 0;
  std::string root;  // DTRAIN_MEMORY_DIR
  int rank = 0;
  std::vector<at::Tensor> keep;  // host copies the shards point into (never live tensors)
  std::vector<dtrain::checkpoint::ShardData> shards;
  dtrain::checkpoint::Index index;          // as of `step`
  std::vector<std::pair<int, int>> peers;   // (send to, receive from) for the 1st, 2nd, ... next node
  std::shared_future<void> copied;          // PreparedSave::copied: `keep` is complete once ready
};
// Training thread: the state as of `step` (collective the first time per world).
MemoryCopy prepare_memory_copy(const TrainState& s, int64_t step, const PreparedSave* host);
// Writer thread, collective over `g` (the writers' group); returns the bytes of this rank's file.
uint64_t write_memory_copy(comm::Group& g, MemoryCopy& c);
}  // namespace detail

// Collective at start-up: the newest step not older than `disk_step` (-1:
// no checkpoint on disk) of which some surviving node holds every old rank's
// shard is gathered, presented as a checkpoint directory in this node's
// memory and loaded (any mesh, as from disk). Rank 0 logs where each shard
// came from. Returns the step, or -1 when memory holds no such step (disk
// is then the fallback, and rank 0 says which shards were missing).
int64_t restore_from_memory(const TrainState& s, int64_t disk_step);

}  // namespace dtrain::engine::checkpoint
