// The names of train.offload's files, shared by the engine (which creates
// and removes them) and the launcher (which removes what killed workers
// left): DIR/dtrain-offload-<job>-rank<r>.bin (AdamW's moments) and
// DIR/dtrain-offload-<job>-rank<r>.params.bin (ZeRO-3's parameter shards),
// the job name made file-safe.
#pragma once

#include <string>

namespace dtrain {

std::string offload_file(const std::string& dir, const std::string& job, int rank);
std::string offload_params_file(const std::string& dir, const std::string& job, int rank);

// Removes DIR's offload files (both kinds) of `job` whose rank is >= min_rank; returns
// how many. Other files are never touched.
int remove_offload_files(const std::string& dir, const std::string& job, int min_rank);

}  // namespace dtrain
