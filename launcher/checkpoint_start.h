// What a launch does with the checkpoints already in checkpoint.dir, decided
// before any worker starts, so a step_<N> directory is never overwritten:
// resume from `latest`; refuse a fresh start beside old steps; move steps
// newer than the one resumed from (or everything, with --fresh) aside into
// previous_<time>/. Run by the agent holding the directory's lock; the
// directory protocol itself is common/checkpoint_dir.h.
#pragma once

#include <string>

namespace dtrain::launcher {

struct CheckpointStart {
  std::string resume_from;  // a step_<N> dir or checkpoint root given by the user ("" = none)
  bool fresh = false;       // --fresh: move every old step aside and start from scratch
};

// Applies the rules to `root` (checkpoint.dir, may be empty). Returns the
// step directory the workers will load ("" = start from scratch). Throws
// dtrain::Error(config) for a fresh start into a directory holding steps
// without a valid `latest`, listing the choices.
// A root that is or lies in a moved-aside previous_<time>/ is refused (its
// steps are never written over or pruned); a `latest` that does not name a
// step of root itself is refused naming what it says (nothing moved).
std::string prepare_checkpoint_start(const std::string& root, const CheckpointStart& start);
// The same decisions and refusals without touching anything: launch runs it
// before it creates or locks any directory.
void check_checkpoint_start(const std::string& root, const CheckpointStart& start);

}  // namespace dtrain::launcher
