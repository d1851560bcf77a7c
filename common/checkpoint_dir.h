// The atomic checkpoint directory protocol (DESIGN.md section 6): files go
// to <root>/step_<N>.tmp/, are fsynced with the directory, which is renamed
// to step_<N>/; then `latest` (a one-line file) is replaced by rename;
// checkpoints beyond `keep` are deleted only after that. Leftover .tmp
// entries are cleaned at the next start. Paths only: no tensors here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::checkpoint {

constexpr const char* kLatestFile = "latest";

std::string step_dir_name(int64_t step);                   // "step_20"
std::string tmp_dir(const std::string& root, int64_t step);  // <root>/step_20.tmp

// mkdir -p root; removes a stale step_<N>.tmp and creates it empty.
void prepare_tmp_dir(const std::string& root, int64_t step);
// fsync a file or a directory; throws dtrain::Error(checkpoint) on failure.
void fsync_path(const std::string& path);
// fsync every file of step_<N>.tmp and the dir, rename it to step_<N>
// (replacing an existing step_<N>), fsync root, replace `latest`, then
// delete complete checkpoints beyond the newest `keep` (keep <= 0: keep all).
void commit(const std::string& root, int64_t step, int keep);
// Removes <root>/*.tmp and latest.tmp; returns how many entries it removed.
int clean_stale(const std::string& root);
// Steps of the complete step_<N> directories of root, ascending.
std::vector<int64_t> list_steps(const std::string& root);
// <root>/<latest's content>, or "" when root has no `latest`. Throws when
// `latest` names a directory that does not exist.
std::string latest_dir(const std::string& root);
// A checkpoint directory from what a user gave: a step_<N> dir (has
// index.json), a run's checkpoint root (follows latest), or the latest file.
// Throws dtrain::Error(checkpoint) naming the path when it is none of them.
std::string resolve(const std::string& path);

}  // namespace dtrain::checkpoint
