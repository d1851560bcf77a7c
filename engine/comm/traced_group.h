// The collective trace's writer: a Group decorator that records every op it
// passes on (group, per-group sequence number, op, bytes, enter and leave
// times) in this rank's trace file (common/collective_trace.h), plus the
// step and phase the trainer sets. An async op leaves when its wait()
// returns. Point-to-point ops are recorded but take no sequence number
// (peers, not the whole group, match them). Knows nothing of hangs.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/collective_trace.h"
#include "engine/comm/comm.h"

namespace dtrain::engine::comm {

class CollectiveTrace {
 public:
  // <run_dir>/collectives/rank_<rank>.trace, created (truncated) and mapped;
  // null (with a warning) when it cannot be.
  static std::shared_ptr<CollectiveTrace> create(const std::string& run_dir, int rank);
  ~CollectiveTrace();
  CollectiveTrace(const CollectiveTrace&) = delete;
  CollectiveTrace& operator=(const CollectiveTrace&) = delete;

  // Returns the collective's number (for leave). seq_counted: bump the group's sequence.
  uint64_t enter(const std::string& group, const char* op, uint64_t bytes, bool seq_counted);
  void block(uint64_t number);  // the rank now waits for collective `number`
  // An async op's launch returned: no longer waiting (its blocked time counts).
  void unblock(uint64_t number, int64_t blocked_ns);
  void leave(uint64_t number, int64_t blocked_ns);
  void set_step(int64_t step);
  void set_phase(trace::Phase phase);
  // Step timing (FileLayout's last block): where the run starts, each
  // completed step, checkpoint blocking, each logged loss.
  void set_run_start(int64_t start_step, int64_t tokens_per_step);
  void step_done(int64_t step, int64_t step_ns);
  void add_checkpoint_ns(int64_t ns);
  void set_logged(double loss, double straggler_ratio);
  // Nanoseconds this rank spent blocked in collectives (sync calls and waits).
  int64_t blocked_ns() const;

 private:
  explicit CollectiveTrace(trace::FileLayout* file) : f_(file) {}
  uint32_t slot_of(const std::string& group);  // under mu_

  trace::FileLayout* f_;
  mutable std::mutex mu_;
  int64_t blocked_ns_ = 0;
};

// The process's trace (null when none: init_comm without a run dir). The
// trainer marks steps and phases through these; they do nothing without one.
void set_process_trace(std::shared_ptr<CollectiveTrace> trace);
CollectiveTrace* process_trace();
void trace_step(int64_t step);
void trace_phase(trace::Phase phase);
int64_t trace_blocked_ns();  // CollectiveTrace::blocked_ns(), 0 without a trace
// CollectiveTrace's step timing; nothing without a trace.
void trace_run_start(int64_t start_step, int64_t tokens_per_step);
void trace_step_done(int64_t step, double step_s);
void trace_checkpoint_s(double seconds);
void trace_logged(double loss, double straggler_ratio);

// `inner`, with every op recorded in `trace`.
std::unique_ptr<Group> traced(std::unique_ptr<Group> inner, std::shared_ptr<CollectiveTrace> trace);

}  // namespace dtrain::engine::comm
