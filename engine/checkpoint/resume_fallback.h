// The automatic resume's fallback past a corrupt newest checkpoint: a resume
// that picked `latest` by itself (a restart, a round change, a launch into a
// run dir with a checkpoint) uses the newest step of checkpoint.dir that
// verifies, naming what it skipped. An explicit resume (--resume-from) never
// comes here: it refuses a checkpoint that does not verify.
#pragma once

#include <string>

#include "engine/checkpoint/checkpoint.h"

namespace dtrain::engine::checkpoint {

// `latest` (a step_<N> dir of checkpoint.dir) if every shard's checksum
// verifies, else (fall_back) the newest older step that does (rank 0 checks,
// every rank gets its answer). Throws dtrain::Error(checkpoint) naming each
// step it tried when none verifies, or when `latest` does not and fall_back
// is false (a run started by --resume-from: its restarts never go back past
// what the user named). Collective over s.control.
std::string newest_verified(const TrainState& s, const std::string& latest, bool fall_back);

// After a restore from the nodes' memory at a step no older than disk's
// `latest`, which the restore did not read: `latest_dir` verified on a
// thread of its own, off the restart's path, and named when it does not
// verify (the warning a fallback would print); a later restart from disk
// skips it then. One at a time: the next call waits for the one before.
void verify_in_background(const std::string& latest_dir);

// Waits for verify_in_background's thread: run_training's end (every path).
class BackgroundVerifyScope {
 public:
  BackgroundVerifyScope() = default;
  BackgroundVerifyScope(const BackgroundVerifyScope&) = delete;
  BackgroundVerifyScope& operator=(const BackgroundVerifyScope&) = delete;
  ~BackgroundVerifyScope();
};

}  // namespace dtrain::engine::checkpoint
