// The worker's training entry: reads the environment contract and the
// resolved spec (DTRAIN_SPEC), builds comm, model, data, optimizer and the
// parallel wrapper, and runs the loop. Returns the process exit code.
#pragma once

namespace dtrain::engine::trainer {

int run_training();

}  // namespace dtrain::engine::trainer
