// checkpoint.async: the training thread takes the save's host copies at the
// step boundary; a writer thread per rank does the rest and commits with the
// other ranks' writers over their own Gloo group (AsyncSaveScope's), never
// over the training thread's groups. At most one save in flight per process.
// Not here: the file format and the directory protocol (common/checkpoint_*).
#include <ATen/ops/full.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <memory>
#include <thread>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_writer.h"
#include "common/error.h"
#include "common/log.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/comm/round_abort.h"
#include "engine/comm/side_group.h"

namespace dtrain::engine::checkpoint {
namespace {
namespace ck = dtrain::checkpoint;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// One save, shared by the training thread and its writer: a writer left
// behind by a round's end (AsyncSaveScope) keeps its own.
struct SaveJob {
  detail::PreparedSave save;       // the writer's until `done`
  std::atomic<bool> done{false};   // the writer finished (committed or failed)
  std::exception_ptr error;        // set by the writer before `done`
  double write_ms = 0;             // this rank's file
};

struct InFlight {
  comm::Group* group = nullptr;    // the writers' (AsyncSaveScope's); null: no async saves
  bool active = false;             // started and not yet reported (training thread only)
  std::shared_ptr<SaveJob> job = std::make_shared<SaveJob>();
  std::thread writer;
  int failed_in_row = 0;           // saves in a row that failed on I/O while training went on
  ~InFlight() {
    if (writer.joinable()) writer.detach();  // at exit: never wait on a peer
  }
};

InFlight& in_flight() {
  static InFlight f;
  return f;
}

// What the writer needs of the TrainState, copied: the training thread's
// objects move on while it runs.
struct WriterJob {
  comm::Group* group = nullptr;
  std::string root;
  int keep = 0;
  int rank = 0;
};

// One collective round of the writers: every rank's flag, max over the
// world. It is also their barrier: no writer passes it before all reach it.
float agree(comm::Group& g, float flag) {
  at::Tensor t = at::full({1}, flag, at::kFloat);  // [1]
  g.all_reduce(t, /*async=*/false, comm::ReduceOp::max);
  return t.data_ptr<float>()[0];
}

[[noreturn]] void peer_failed(int64_t step, const std::string& what, const std::string& dir) {
  throw Error(ErrorCode::checkpoint,
              "checkpoint of step " + std::to_string(step) + " not committed: another rank " + what + " (" + dir + ")",
              "see that rank's error; latest stays on the previous checkpoint");
}

// The writer's protocol, the same on every rank, three rounds of `agree`:
//   1. rank 0 has made step_<N>.tmp and no rank's copies hold NaN or inf
//      (else nothing is written, and every rank throws);
//   2. every rank file is written and fsynced;
//   3. rank 0 has written index.json and committed (rename, latest, keep).
// A rank killed mid-write never reaches round 2: the others' collective
// fails when its sockets close, and latest stays where it was.
void write_and_commit(const WriterJob& job, detail::PreparedSave& p, double& write_ms) {
  comm::Group& g = *job.group;
  std::exception_ptr own;
  const std::string bad = detail::first_nonfinite_copy(p);
  if (job.rank == 0 && bad.empty()) {
    try {
      ck::prepare_tmp_dir(job.root, p.step);
    } catch (...) {
      own = std::current_exception();
    }
  }
  const float first = agree(g, !bad.empty() ? float(job.rank + 2) : own ? 1.0f : 0.0f);
  if (first >= 2 && job.rank == 0 && !own) {  // nothing of this step is written: not even its directory
    std::error_code ec;
    std::filesystem::remove_all(p.dir, ec);
  }
  if (first >= 2)
    throw Error(ErrorCode::config,
                "checkpoint of step " + std::to_string(p.step) + " not written: the training state holds NaN or inf (" +
                    (bad.empty() ? "rank " + std::to_string(int(first) - 2) : "this rank's " + bad) + ")",
                "the run diverged; lower train.lr or clip gradients with train.grad_clip, and resume from the "
                "last checkpoint in checkpoint.dir = " + job.root);
  if (own) std::rethrow_exception(own);
  if (first > 0) peer_failed(p.step, "could not make the step's directory", p.dir);

  const auto w0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  try {
    bytes = detail::write_prepared(p);
  } catch (...) {
    own = std::current_exception();
  }
  write_ms = ms_since(w0);
  if (agree(g, own ? 1.0f : 0.0f) > 0) {
    if (job.rank == 0) {  // every writer is past its write: the partial step frees its space
      std::error_code ec;
      std::filesystem::remove_all(p.dir, ec);
    }
    if (own) std::rethrow_exception(own);
    peer_failed(p.step, "failed to write its file", p.dir);
  }
  const auto c0 = std::chrono::steady_clock::now();
  if (job.rank == 0) {
    try {
      ck::write_index(p.dir, std::move(p.index));
      ck::commit(job.root, p.step, job.keep);
    } catch (...) {
      own = std::current_exception();
    }
  }
  if (agree(g, own ? 1.0f : 0.0f) > 0) {
    if (own) std::rethrow_exception(own);
    peer_failed(p.step, "failed to commit", p.dir);
  }
  if (job.rank == 0)
    DTRAIN_INFO("checkpoint {}/{} committed (async): {:.1f} MB from rank 0 written in {:.0f} ms, commit {:.0f} ms",
                job.root, ck::step_dir_name(p.step), double(bytes) / 1e6, write_ms, ms_since(c0));
}

// Whether a failed save may leave training going on: an I/O failure of the
// write or the commit (a full or failing disk), which every writer met in
// the same save (they agree on its outcome), with the previous `latest`
// intact. Not non-finite state (config: the run diverged) nor our bug.
bool io_failure(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.code() == ErrorCode::checkpoint;
  } catch (...) {
    return false;
  }
}

// Joins a finished (or, with `wait`, any) writer; returns its write time,
// or -1 when there is nothing to report yet. Rethrows the writer's failure,
// except (with `tolerate`) an I/O failure, fewer than kMaxFailedSaves in a
// row: then it warns and training goes on (the in-memory copies and the
// previous checkpoint still hold the state; the next save tries again).
double collect(bool wait, bool tolerate, const TrainState& s) {
  InFlight& f = in_flight();
  SaveJob& j = *f.job;
  if (!f.active || (!wait && !j.done.load(std::memory_order_acquire))) return -1;
  if (f.writer.joinable()) f.writer.join();
  f.active = false;
  if (!j.error) {
    f.failed_in_row = 0;
    return j.write_ms;
  }
  if (!tolerate || !io_failure(j.error) || ++f.failed_in_row >= kMaxFailedSaves) std::rethrow_exception(j.error);
  try {
    std::rethrow_exception(j.error);
  } catch (const std::exception& e) {
    if (s.info->rank == 0) {
      const std::string what = e.what();
      const std::string latest = dtrain::checkpoint::latest_dir(s.spec->checkpoint.dir);
      DTRAIN_ERROR("checkpoint of step {} failed: {}; training goes on ({}; {} failed save(s) in a row, the job "
                   "stops at {}; the next save {} tries again)",
                   j.save.step, what.substr(0, what.find('\n')),
                   latest.empty() ? "no checkpoint exists yet" : "latest stays " + latest, f.failed_in_row,
                   kMaxFailedSaves,
                   s.spec->checkpoint.every > 0 ? "at step " + std::to_string(j.save.step + s.spec->checkpoint.every)
                                                : "at the end");
    }
  }
  j.error = nullptr;
  return j.write_ms;
}

}  // namespace

bool async_save_in_flight() { return in_flight().active; }

double poll_async_save(const TrainState& s) { return collect(/*wait=*/false, /*tolerate=*/true, s); }

double finish_async_save(const TrainState& s) { return collect(/*wait=*/true, /*tolerate=*/false, s); }

double start_async_save(const TrainState& s, int64_t step, detail::PreparedSave* host) {
  InFlight& f = in_flight();
  if (f.group == nullptr)
    throw Error(ErrorCode::internal, "checkpoint.async without the writers' process group",
                "the trainer holds a checkpoint::AsyncSaveScope while it trains");
  double committed = -1;
  if (f.active) {  // at most one in flight: this save waits for the previous one
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t previous = f.job->save.step;
    committed = collect(/*wait=*/true, /*tolerate=*/true, s);
    if (s.info->rank == 0)
      DTRAIN_INFO("checkpoint: the save of step {} waited {:.1f} ms for the write of step {}", step, ms_since(t0),
                  previous);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto j = std::make_shared<SaveJob>();
  j->save = host != nullptr ? std::move(*host) : detail::take_snapshot(s, step);
  f.job = j;
  f.active = true;
  if (s.info->rank == 0)
    DTRAIN_INFO("checkpoint of step {} started (async): host copies {} in {:.1f} ms", step,
                host != nullptr ? "shared with the in-memory copy" : "taken", ms_since(t0));
  const WriterJob job{f.group, s.spec->checkpoint.dir, s.spec->checkpoint.keep, s.info->rank};
  f.writer = std::thread([j, job] {
    try {
      write_and_commit(job, j->save, j->write_ms);
    } catch (...) {
      j->error = std::current_exception();
    }
    j->save.keep.clear();  // the host copies, whatever happened
    j->save.shards.clear();
    j->done.store(true, std::memory_order_release);
  });
  return committed;
}

AsyncSaveScope::AsyncSaveScope(comm::Comm& comm, const JobSpec& spec) {
  if (!spec.checkpoint.async || spec.checkpoint.dir.empty()) return;
  writers_ = comm::make_side_group(comm, "checkpoint");
  in_flight().group = writers_.get();
  in_flight().failed_in_row = 0;
}

AsyncSaveScope::~AsyncSaveScope() {
  InFlight& f = in_flight();
  const bool was_active = f.active;
  std::shared_ptr<SaveJob> j = f.job;
  if (f.writer.joinable()) {
    if (comm::leaving_round() && !j->done.load(std::memory_order_acquire)) {
      // The round ended (or a failure unwinds the trainer) with the write in
      // flight: a Gloo op of the writer can stay waiting, for the group's
      // timeout, on a pair a cut link left half open, which no shut socket
      // wakes (comm::leaving_round). The writer is left behind with its job
      // and the leaked group below, and the next round goes on; it commits
      // nothing, its peers left the collective it waits in.
      f.writer.detach();
      DTRAIN_WARN("checkpoint of step {} was not committed: the round ended with its write in flight; its writer "
                  "is left behind", j->save.step);
      f.job = std::make_shared<SaveJob>();
      f.group = nullptr;
      f.active = false;
      (void)writers_.release();
      return;
    }
    f.writer.join();  // its collectives end with its peers' (or fail when they are gone)
  }
  f.group = nullptr;
  f.active = false;
  // After a round abort the group is leaked, as TrainSession's are: a c10d
  // destructor could block on work queued on the sockets end_round shut.
  if (comm::leaving_round()) (void)writers_.release();
  if (was_active && j->error) {
    try {
      std::rethrow_exception(j->error);
    } catch (const std::exception& e) {
      DTRAIN_WARN("checkpoint of step {} was not committed: {}", j->save.step, e.what());
    }
  }
}

}  // namespace dtrain::engine::checkpoint
