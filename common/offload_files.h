// The names of train.offload's files, shared by the engine (which creates
// and removes them) and the launcher (which removes what killed workers
// left): DIR/dtrain-offload-<job>-rank<r>.bin (AdamW's moments) and
// DIR/dtrain-offload-<job>-rank<r>.params.bin (ZeRO-3's parameter shards),
// the job name made file-safe. Also the test override that lets
// train.offload.optimizer and .params: host run on a CPU.
#pragma once

#include <string>

namespace dtrain {

std::string offload_file(const std::string& dir, const std::string& job, int rank);
std::string offload_params_file(const std::string& dir, const std::string& job, int rank);

// Removes DIR's offload files (both kinds) of `job` whose rank is >= min_rank; returns
// how many. Other files are never touched.
int remove_offload_files(const std::string& dir, const std::string& job, int min_rank);

// Tests only: DTRAIN_TEST_HOST_OFFLOAD_ON_CPU=1 in the environment lets
// train.offload.optimizer: host run on cluster.device cpu, where it keeps
// its master and moments in host buffers of their own and copies the
// gradients in and the parameters out as under a GPU, and .params: host,
// where ZeRO-3's shards wait in a host buffer of their own between uses;
// without it, host on a CPU is refused (it would only copy memory to memory).
constexpr const char* kHostOffloadOnCpuEnv = "DTRAIN_TEST_HOST_OFFLOAD_ON_CPU";
bool host_offload_on_cpu();

}  // namespace dtrain
