// The engine's side of the spec's fault section (fault.h): which rank fails,
// when, and how. The crash in the middle of a save is carried out by the
// writer (checkpoint.cpp), which asks crash_during_save.
#include "engine/checkpoint/fault.h"

#include <chrono>
#include <csignal>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/log.h"

namespace dtrain::engine::checkpoint {
namespace {

bool is_target(const FaultSpec& f, const comm::WorldInfo& info) {
  return info.restart == 0 && info.rank == f.rank;
}

}  // namespace

void fault_in_step(const FaultSpec& f, const comm::WorldInfo& info, int64_t step) {
  if (f.kind == FaultKind::slow && is_target(f, info) && step >= f.step)
    std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
  if (f.kind == FaultKind::raise && is_target(f, info) && step == f.step) {
    DTRAIN_WARN("fault.kind = raise: rank {} throws an exception in step {} on purpose", info.rank,
                step);
    throw std::runtime_error("fault.kind = raise: rank " + std::to_string(info.rank) +
                             " throws in step " + std::to_string(step) +
                             " on purpose (chaos testing)");
  }
}

bool nan_grad_in_step(const FaultSpec& f, const comm::WorldInfo& info, int64_t step) {
  if (f.kind != FaultKind::nan_grad || !is_target(f, info) || step != f.step) return false;
  DTRAIN_WARN("fault.kind = nan_grad: rank {} makes its gradients of step {} NaN on purpose", info.rank, step);
  return true;
}

void fault_after_step(const FaultSpec& f, const comm::WorldInfo& info, int64_t step) {
  if (!is_target(f, info) || step != f.step) return;
  if (f.kind == FaultKind::kill_after_step) ::raise(SIGKILL);
  if (f.kind == FaultKind::hang) {
    DTRAIN_WARN("fault.kind = hang: rank {} stops after step {} and sleeps until it is killed",
                info.rank, step);
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

bool crash_during_save(const FaultSpec& f, const comm::WorldInfo& info, int64_t step) {
  return f.kind == FaultKind::crash_during_save && is_target(f, info) && (f.step == 0 || f.step == step);
}

}  // namespace dtrain::engine::checkpoint
