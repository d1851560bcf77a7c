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

struct InFlight {
  comm::Group* group = nullptr;   // the writers' (MemoryCopyScope's); null: no copies
  bool active = false;            // started and not yet reported (training thread only)
  detail::MemoryCopy copy;        // the writer's until `done`
  std::thread writer;
  std::atomic<bool> done{false};  // the writer finished (the step is complete everywhere, or it failed)
  std::exception_ptr error;       // set by the writer before `done`
  double copy_ms = 0;             // the writer's whole time: write, exchange, barrier, drop
  ~InFlight() {
    if (writer.joinable()) writer.join();
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
  if (!f.active || (!wait && !f.done.load(std::memory_order_acquire))) return -1;
  if (f.writer.joinable()) f.writer.join();
  f.active = false;
  if (f.error) std::rethrow_exception(f.error);
  return f.copy_ms;
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
    const int64_t previous = f.copy.step;
    waited_for = collect(/*wait=*/true);
    if (s.info->rank == 0)
      DTRAIN_INFO("in-memory copy of step {} waited {:.1f} ms for the copy of step {}", step, ms_since(t0), previous);
  }
  const auto t0 = std::chrono::steady_clock::now();
  f.copy = detail::prepare_memory_copy(s, step, host);
  f.done.store(false);
  f.error = nullptr;
  f.copy_ms = 0;
  f.active = true;
  if (s.info->rank == 0)
    DTRAIN_INFO("in-memory copy of step {} started: host copies {} in {:.1f} ms", step,
                host != nullptr ? "shared with the disk save" : "taken", ms_since(t0));
  comm::Group* g = f.group;
  f.writer = std::thread([&f, g] {
    const auto w0 = std::chrono::steady_clock::now();
    try {
      const uint64_t bytes = detail::write_memory_copy(*g, f.copy);
      DTRAIN_DEBUG("in-memory copy of step {}: {} bytes here and on {} other node(s) in {:.1f} ms", f.copy.step,
                   bytes, f.copy.peers.size(), ms_since(w0));
    } catch (...) {
      f.error = std::current_exception();
    }
    f.copy.keep.clear();  // the host copies, whatever happened
    f.copy.shards.clear();
    f.copy_ms = ms_since(w0);
    f.done.store(true, std::memory_order_release);
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
  const int64_t step = f.copy.step;
  // Its collectives end with its peers' (or fail when they are gone, or at
  // once when the round is ended in place: end_round shuts the sockets).
  if (f.writer.joinable()) f.writer.join();
  f.group = nullptr;
  f.active = false;
  // After a round abort the group is leaked, as TrainSession's are: a c10d
  // destructor could block on work queued on the sockets end_round shut.
  if (comm::round_aborted()) (void)writers_.release();
  f.copy = detail::MemoryCopy{};
  if (was_active && f.error) {
    try {
      std::rethrow_exception(f.error);
    } catch (const std::exception& e) {
      DTRAIN_WARN("in-memory copy of step {} was not completed on every node: {}", step, e.what());
    }
  }
  f.error = nullptr;
}

}  // namespace dtrain::engine::checkpoint
