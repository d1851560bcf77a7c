// `dtrain-worker bench-comm`: nccl-tests style measurement of one collective
// over the world group, run by every worker that `dtrain bench comm` launches.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain::engine::comm {

struct CommBenchOptions {
  std::string op = "all_reduce";  // all_reduce|all_gather|reduce_scatter|all_to_all|broadcast
  int64_t min_bytes = 1024;
  int64_t max_bytes = 64 << 20;
  int iters = 5;    // timed repeats per size (median reported)
  int warmup = 1;
  std::string dtype = "fp32";
  std::string reduce_scatter = "ring";  // ring (dtrain's) | native (Gloo's own)
  bool hierarchical = true;  // CommOptions::hierarchical (groups that span nodes)
  // all_reduce: the buffer in the group's symmetric buffer (symmetric_buffer.h)
  // where the group makes one, as DDP's buckets (nccl-tests' -R, registered
  // buffers); a private tensor where it does not (the header says which).
  bool registered = false;
};

// Rank 0 prints the table; every rank checks its results. Returns the exit
// code (non-zero when a result was wrong).
int run_comm_bench(const CommBenchOptions& options);

}  // namespace dtrain::engine::comm
