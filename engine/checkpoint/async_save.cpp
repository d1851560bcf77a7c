// checkpoint.async: the save's host copies are taken at the step boundary and
// a background thread of this rank writes its file while training goes on.
// Every collective (the finiteness check, barriers, the done-flag all-reduce,
// rank 0's index + commit) stays on the training thread: the writer only
// writes. At most one save is in flight per process.
#include <ATen/ops/empty.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/log.h"
#include "engine/checkpoint/checkpoint.h"

namespace dtrain::engine::checkpoint {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct InFlight {
  bool active = false;                 // started and not yet committed (training thread only)
  detail::PreparedSave save;           // the writer's until `done`
  std::thread writer;
  std::atomic<bool> done{false};       // the writer finished (error or not)
  std::exception_ptr error;            // set by the writer before `done`
  uint64_t bytes = 0;
  double write_ms = 0;
  // A run that ends by an exception with a write in flight: the write
  // finishes (never committed: step_<N>.tmp is cleaned at the next start).
  ~InFlight() {
    if (writer.joinable()) writer.join();
  }
};

InFlight& in_flight() {
  static InFlight f;
  return f;
}

}  // namespace

bool async_save_in_flight() { return in_flight().active; }

double finish_async_save(const TrainState& s, bool wait) {
  InFlight& f = in_flight();
  if (!f.active) return -1;
  if (wait && f.writer.joinable()) f.writer.join();
  at::Tensor flags = at::empty({2}, at::kFloat);  // [not done, failed], max over the world
  flags.data_ptr<float>()[0] = f.done.load(std::memory_order_acquire) ? 0.0f : 1.0f;
  flags.data_ptr<float>()[1] = f.error ? 1.0f : 0.0f;
  s.control->all_reduce(flags, /*async=*/false, comm::ReduceOp::max);
  if (flags.data_ptr<float>()[0] > 0) return -1;  // some rank is still writing: next step
  if (f.writer.joinable()) f.writer.join();
  f.active = false;
  if (flags.data_ptr<float>()[1] > 0) {
    if (f.error) std::rethrow_exception(f.error);
    throw Error(ErrorCode::checkpoint,
                "checkpoint of step " + std::to_string(f.save.step) + " not committed: another rank failed to write "
                "its file into " + f.save.dir, "see that rank's error above; latest stays on the previous checkpoint");
  }
  const auto t0 = std::chrono::steady_clock::now();
  detail::commit_prepared(s, f.save);
  if (s.info->rank == 0)
    DTRAIN_INFO("checkpoint {}/{} committed (async): {:.1f} MB from rank 0 written in {:.0f} ms, commit {:.0f} ms",
                s.spec->checkpoint.dir, dtrain::checkpoint::step_dir_name(f.save.step), double(f.bytes) / 1e6,
                f.write_ms, ms_since(t0));
  return f.write_ms;
}

double start_async_save(const TrainState& s, int64_t step) {
  InFlight& f = in_flight();
  double committed = -1;
  if (f.active) {  // at most one in flight: this save waits for the previous one
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t previous = f.save.step;
    committed = finish_async_save(s, /*wait=*/true);
    if (s.info->rank == 0)
      DTRAIN_INFO("checkpoint: the save of step {} waited {:.0f} ms for the write of step {}", step, ms_since(t0),
                  previous);
  }
  const auto t0 = std::chrono::steady_clock::now();
  f.save = detail::prepare_save(s, step, /*copy=*/true);
  f.done.store(false);
  f.error = nullptr;
  f.active = true;
  if (s.info->rank == 0)
    DTRAIN_INFO("checkpoint of step {} started (async): host copies taken in {:.0f} ms", step, ms_since(t0));
  f.writer = std::thread([&f] {
    const auto w0 = std::chrono::steady_clock::now();
    try {
      f.bytes = detail::write_prepared(f.save);
    } catch (...) {
      f.error = std::current_exception();
    }
    f.write_ms = ms_since(w0);
    f.done.store(true, std::memory_order_release);
  });
  return committed;
}

}  // namespace dtrain::engine::checkpoint
