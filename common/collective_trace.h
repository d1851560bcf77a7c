// The collective trace file: where a worker is in its collectives, written by
// the engine (engine/comm/traced_group.h) into a small memory-mapped file per
// rank, <run_dir>/collectives/rank_<r>.trace, and read by the node agent
// without asking the worker (a hung rank answers nothing). Owns the binary
// layout and the reader; it does not decide what a hang is (the rendezvous does).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::trace {

constexpr char kMagic[8] = {'D', 'T', 'C', 'O', 'L', 'L', '0', '1'};
constexpr uint32_t kRingSize = 64;  // the last 64 collectives
constexpr uint32_t kMaxGroups = 8;  // world, control, dp, tp, pp, ep, edp (+1)

// What the rank is doing, set by the trainer.
enum class Phase : uint32_t { init = 0, forward, backward, optimizer, logging, checkpoint, done };
const char* phase_name(uint32_t phase);

// Fields are written with atomic stores by one thread of the worker and read
// with atomic loads by the agent; a record is bracketed by its `stamp`
// (odd while it is being rewritten), so a reader never takes half of one.
struct GroupSlot {
  char name[8];
  uint64_t entered;    // per-group sequence number of the last collective entered (1-based)
  uint64_t completed;  // ... and completed
};

struct Record {
  uint64_t stamp;
  char group[8];
  char op[16];
  uint64_t seq;       // per group
  uint64_t bytes;
  int64_t enter_ns;   // CLOCK_REALTIME
  int64_t leave_ns;   // 0 while in flight
};

struct FileLayout {
  char magic[8];
  uint32_t version;
  int32_t rank;
  uint64_t entered;    // collectives entered, all groups
  uint64_t completed;  // collectives completed, all groups
  uint64_t blocked;    // the number of the collective the rank waits for now (0 = none):
                       // an async op counts from its wait(), not from its launch
  int64_t step;        // the step being run (1-based; 0 before the first)
  uint32_t phase;
  uint32_t ngroups;
  GroupSlot groups[kMaxGroups];
  Record ring[kRingSize];  // the collective entered as number n lives at ring[(n - 1) % kRingSize]
  // Step timing, for goodput (launcher/goodput.h) and `dtrain status`: one
  // writer, each field stored atomically (doubles as their bits).
  int64_t first_step_ns;     // CLOCK_REALTIME when this process began its first step (0 = not yet)
  int64_t start_step;        // steps done before this process (the checkpoint it resumed)
  int64_t done_step;         // the last step completed (1-based, absolute)
  int64_t step_ns;           // this process's completed steps' wall time, summed
  int64_t last_step_ns;      // the last completed step's
  int64_t checkpoint_ns;     // time blocked in checkpoint saves, summed
  int64_t tokens_per_step;   // global batch * seq_len
  uint64_t loss_bits;        // the last logged global-mean loss (a double; NaN = none yet)
  uint64_t straggler_bits;   // its straggler ratio (a double)
};

std::string trace_path(const std::string& run_dir, int rank);

struct Collective {
  std::string group, op;
  uint64_t seq = 0, bytes = 0;
  int64_t enter_ns = 0, leave_ns = 0;
};

// One rank's position, as the agent reports it with each heartbeat.
struct RankProgress {
  int rank = -1;
  uint64_t entered = 0, completed = 0;
  int64_t step = 0;
  std::string phase;
  bool waiting = false;  // blocked in a collective now: `pending` is the one it waits for
  Collective pending;
  bool has_done = false;
  Collective last_done;  // the last collective it completed
  std::vector<std::pair<std::string, uint64_t>> group_entered;  // (group, last seq entered)
  // Step timing (FileLayout's last block).
  int64_t first_step_ns = 0, start_step = 0, done_step = 0, step_ns = 0, last_step_ns = 0, checkpoint_ns = 0;
  int64_t tokens_per_step = 0;
  double loss = 0, straggler_ratio = 0;
  bool has_loss = false;
  // The worker process's CPU time (user + system), read by its agent from
  // /proc, not from the trace (0 = unknown): a rank that computes slowly
  // gains some between beats, a stopped or stuck one none.
  int64_t cpu_ns = 0;
  double tokens_per_s() const { return last_step_ns > 0 ? double(tokens_per_step) * 1e9 / double(last_step_ns) : 0; }
};

// Reads a trace file; false when it is missing or not a trace (e.g. a custom
// entrypoint that writes none).
bool read_progress(const std::string& path, RankProgress* out);

}  // namespace dtrain::trace
