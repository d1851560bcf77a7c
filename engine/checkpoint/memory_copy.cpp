// The in-memory copies in the background (memory_snapshot.h): the training
// thread takes the host copies at the step boundary; a writer thread per rank
// writes them into the node's RAM directory, exchanges them with the peers
// over the writers' own Gloo group (MemoryCopyScope's, never the training
// thread's groups) and barriers. At most one copy in flight per process.
// Not here: what a copy holds and how it is restored (memory_snapshot.cpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "engine/checkpoint/memory_snapshot.h"
#include "engine/comm/round_abort.h"
#include "engine/comm/side_group.h"

namespace dtrain::engine::checkpoint {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// One copy's state, shared by the training thread and its writer: a writer
// left behind by a round abort keeps it alive on its own.
struct Job {
  detail::MemoryCopy copy;
  std::atomic<bool> done{false};  // the writer finished (the step is complete everywhere, or it failed)
  std::exception_ptr error;       // set by the writer before `done`
  double copy_ms = 0;             // the writer's whole time: write, exchange, barrier, drop
};

struct InFlight {
  comm::Group* group = nullptr;  // the writers' (MemoryCopyScope's); null: no copies
  bool active = false;           // started and not yet reported (training thread only)
  std::shared_ptr<Job> job;
  std::thread writer;
  ~InFlight() {
    if (writer.joinable()) writer.detach();  // at exit: never wait on a peer
  }
};

InFlight& in_flight() {
  static InFlight f;
  return f;
}

// Joins a finished (or, with `wait`, any) writer; returns its time, or -1
// when there is nothing to report yet. Rethrows the writer's failure.
double collect(bool wait) {
  InFlight& f = in_flight();
  if (!f.active || (!wait && !f.job->done.load(std::memory_order_acquire))) return -1;
  if (f.writer.joinable()) f.writer.join();
  f.active = false;
  if (f.job->error) std::rethrow_exception(f.job->error);
  return f.job->copy_ms;
}

}  // namespace

bool memory_copy_in_flight() { return in_flight().active; }

double poll_memory_copy() { return collect(/*wait=*/false); }

double finish_memory_copy() { return collect(/*wait=*/true); }

bool memory_copy_sync() {
  const char* v = std::getenv("DTRAIN_MEMORY_COPY_SYNC");
  return v != nullptr && std::string(v) == "1";
}

double start_memory_copy(const TrainState& s, int64_t step, const detail::PreparedSave* host) {
  InFlight& f = in_flight();
  if (f.group == nullptr)
    throw Error(ErrorCode::internal, "checkpoint.memory without the copy writers' process group",
                "the trainer holds a checkpoint::MemoryCopyScope while it trains");
  double waited_for = -1;
  if (f.active) {  // at most one in flight: this copy waits for the previous one
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t previous = f.job->copy.step;
    waited_for = collect(/*wait=*/true);
    if (s.info->rank == 0)
      DTRAIN_INFO("in-memory copy of step {} waited {:.1f} ms for the copy of step {}", step, ms_since(t0), previous);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto job = std::make_shared<Job>();
  job->copy = detail::prepare_memory_copy(s, step, host);
  f.job = job;
  f.active = true;
  if (s.info->rank == 0)
    DTRAIN_INFO("in-memory copy of step {} started: host copies {} in {:.1f} ms", step,
                host != nullptr ? "shared with the disk save" : "taken", ms_since(t0));
  comm::Group* g = f.group;
  f.writer = std::thread([job, g] {
    const auto w0 = std::chrono::steady_clock::now();
    try {
      const uint64_t bytes = detail::write_memory_copy(*g, job->copy);
      DTRAIN_DEBUG("in-memory copy of step {}: {} bytes here and on {} other node(s) in {:.1f} ms", job->copy.step,
                   bytes, job->copy.peers.size(), ms_since(w0));
    } catch (...) {
      job->error = std::current_exception();
    }
    job->copy.keep.clear();  // the host copies, whatever happened
    job->copy.shards.clear();
    job->copy_ms = ms_since(w0);
    job->done.store(true, std::memory_order_release);
  });
  return waited_for;
}

MemoryCopyScope::MemoryCopyScope(comm::Comm& comm, const JobSpec& spec) {
  const comm::WorldInfo& info = comm.info();
  const int nodes = info.world / std::max(1, info.local_world);
  if (info.memory_dir.empty() || !spec.checkpoint.memory_on(nodes)) return;  // memory_copies_on's test
  writers_ = comm::make_side_group(comm, "memory");
  in_flight().group = writers_.get();
}

MemoryCopyScope::~MemoryCopyScope() {
  InFlight& f = in_flight();
  const bool was_active = f.active;
  std::shared_ptr<Job> job = std::move(f.job);
  f.group = nullptr;
  f.active = false;
  if (f.writer.joinable()) {
    if (comm::leaving_round() && !job->done.load(std::memory_order_acquire)) {
      // end_round shut the sockets, yet a Gloo send can stay waiting (for the
      // group's timeout) on a pair it was posted to: the writer is left behind
      // with its job and the leaked group below, and the next round goes on.
      f.writer.detach();
      DTRAIN_WARN("in-memory copy of step {} was not completed on every node: the round ended with it in "
                  "flight; its writer is left behind", job->copy.step);
    } else {
      f.writer.join();  // its collectives end with its peers' (or fail when they are gone)
    }
  }
  // After a round abort the group is leaked, as TrainSession's are: a c10d
  // destructor could block on work queued on the sockets end_round shut.
  if (comm::leaving_round()) (void)writers_.release();
  if (was_active && job && job->done.load(std::memory_order_acquire) && job->error) {
    try {
      std::rethrow_exception(job->error);
    } catch (const std::exception& e) {
      DTRAIN_WARN("in-memory copy of step {} was not completed on every node: {}", job->copy.step, e.what());
    }
  }
}

}  // namespace dtrain::engine::checkpoint
