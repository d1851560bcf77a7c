// DTRAIN_OP_PROFILE=DIR: every ATen operator and autograd node a rank runs
// during its steps (the first step left out: its allocations and first
// touches), timed through ATen's RecordFunction callbacks and summed by
// (operator, the operator or autograd node it ran under): calls, self and
// total wall time per step. Each rank writes DIR/op_profile_rank_R.txt when
// its training ends, heaviest self time first. bench/profile_step.sh's perf
// samples say which kernels take the time; this says which operators call
// them and from where (a copy under MmBackward0's reshape, say). Costs about
// a microsecond per operator while on (DTRAIN_OP_PROFILE_SHAPES=1 adds the
// tensor inputs' sizes to the key, and more cost); off (the variable unset) it adds
// nothing: no callback is registered.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace dtrain::engine::trainer {

class OpProfile {
 public:
  // Null unless DTRAIN_OP_PROFILE names a directory.
  static std::unique_ptr<OpProfile> from_env(int rank);
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // Before step `step` (0-based) runs: recording starts at step 1.
  void before_step(int64_t step);
  // Writes the table (once; also from the destructor when not called).
  void write();

 private:
  OpProfile(std::string path, int rank);
  std::string path_;
  int rank_;
  uint64_t handle_ = 0;
  bool written_ = false;
  int64_t steps_ = 0;
  int64_t begin_ns_ = 0;
};

}  // namespace dtrain::engine::trainer
