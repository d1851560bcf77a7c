// Goodput: where a job's wall time went, by cause, as node 0's agent sees it,
// kept in <log.dir>/goodput.json across restarts, round changes and later
// resumes into the same log.dir (one segment per launch). Owns the accounting
// and the file; the agent says when things happen, rank 0's collective trace
// (common/collective_trace.h) says how long its steps and saves took.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/collective_trace.h"
#include "common/tensorboard.h"

namespace dtrain::launcher {

// Seconds by cause; they sum to the wall time (idle takes what is left).
struct GoodputSeconds {
  double productive = 0;  // steps computed for the first time
  double redone = 0;      // steps computed again after a restart (lost since the last checkpoint)
  double checkpoint = 0;  // blocked in checkpoint saves
  double restart = 0;     // from a failure or round change until the next attempt's first step
  double startup = 0;     // from the launch until its first step (rendezvous, spawn, set-up)
  double eval = 0;        // evaluation (metrics.jsonl's eval_ms)
  double idle = 0;        // the rest: logging, a step cut short, shutting down
  double sum() const { return productive + redone + checkpoint + restart + startup + eval + idle; }
  GoodputSeconds& operator+=(const GoodputSeconds& o);
};

// One attempt: a set of workers from spawn until they stopped (or now).
struct GoodputAttempt {
  double spawned = 0;        // seconds since the epoch
  bool first = false;        // the launch's first attempt: its lead-in is start-up, else restart
  bool has_trace = false;    // rank 0's trace was read
  trace::RankProgress rank0; // its last reading
  double eval_s = 0;         // eval_ms of its metrics.jsonl lines, summed
};

// An attempt's seconds up to `end`, given the highest step any earlier
// attempt completed (`high_water`): steps at or below it are redone. The
// steps' time is split by count (the trace keeps their sum, not each one).
GoodputSeconds account_attempt(const GoodputAttempt& a, double end, int64_t high_water);

class Goodput {
 public:
  // Continues <run_dir>/goodput.json when there is one (a resume into the
  // same log.dir; a fresh run's is moved aside first, as metrics.jsonl is).
  // tensorboard: also write each update as scalars into <run_dir>/tb/goodput.
  Goodput(std::string run_dir, double now, bool tensorboard = false);

  void started(double now);  // workers spawned
  void observe(double now);  // re-read rank 0's trace and metrics.jsonl; rewrite the file
  void ended(double now);    // the attempt's workers are done for (failure, round change, success)
  void finish(double now);   // the launch ends: writes the file one last time

  GoodputSeconds totals(double now) const;  // every segment, a running attempt up to now
  // The console block: wall time and each cause's seconds and share.
  std::string table(double now) const;
  std::string path() const { return run_dir_ + "/goodput.json"; }

 private:
  void read_earlier();  // goodput.json's segments, if there is one
  void read_trace_and_metrics();
  void write(double now);

  struct Segment {
    double start = 0, end = 0;
    int attempts = 0;
    int64_t first_step = 0, last_step = 0;  // steps this launch started after and reached
    GoodputSeconds seconds;                 // of closed attempts and gaps
  };
  std::string run_dir_;
  std::vector<Segment> earlier_;  // earlier launches' segments, as read
  Segment seg_;                   // this launch's
  int64_t high_water_ = 0;        // the highest step completed before the running attempt
  double gap_start_ = 0;          // when the last attempt ended (or the launch began)
  bool running_ = false;
  GoodputAttempt attempt_;
  int64_t metrics_offset_ = 0;    // where this attempt's metrics.jsonl lines begin
  std::unique_ptr<tb::TensorBoardWriter> tensorboard_;
};

}  // namespace dtrain::launcher
