// The training step this process is in (from 1, as in metrics.jsonl; 0
// before the first), for the error file a failing worker writes. The loop
// sets it at the start of each step; the worker's exception handler reads it.
#pragma once

#include <atomic>
#include <cstdint>

namespace dtrain::engine::trainer {

inline std::atomic<int64_t>& current_step_cell() {
  static std::atomic<int64_t> step{0};
  return step;
}
inline void set_current_step(int64_t step) { current_step_cell().store(step); }
inline int64_t current_step() { return current_step_cell().load(); }

}  // namespace dtrain::engine::trainer
