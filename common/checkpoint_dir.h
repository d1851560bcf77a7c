// The atomic checkpoint directory protocol (docs/ARCHITECTURE.md, 'Checkpoints'):
// files go to <root>/step_<N>.tmp/, are fsynced with the directory, which is
// renamed to step_<N>/; then `latest` (a one-line file) is replaced by rename;
// checkpoints beyond `keep` are deleted only after that. Leftover .tmp entries
// are cleaned at the next start. Paths only: no tensors here.
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
// Only root's own step_<N> entries are pruned, and none when root is or lies
// in a moved-aside previous_<time>/ (archives are never deleted from).
void commit(const std::string& root, int64_t step, int keep);
// Points <root>/latest at step_<N>: latest.tmp written, fsynced, renamed.
void set_latest(const std::string& root, int64_t step);
// Moves the named entries of root (step_<N> dirs, `latest`) into a new
// <root>/previous_<UTC time>/ (never deleted by `keep`); returns its path.
std::string move_aside(const std::string& root, const std::vector<std::string>& names);
// Removes <root>/*.tmp and latest.tmp; returns how many entries it removed.
int clean_stale(const std::string& root);
// Steps of the complete step_<N> directories of root, ascending.
std::vector<int64_t> list_steps(const std::string& root);
// <root>/<latest's content>, or "" when root has no `latest`. Throws
// dtrain::Error(checkpoint) naming what `latest` says unless it names a
// step_<N> directory of root itself (a plain name, not a link): a `latest`
// reaching outside root ("../x/step_5", "/abs") is refused, never followed.
std::string latest_dir(const std::string& root);
// "previous_20250101T120000Z" or "previous_20250101T120000Z_2": a directory
// move_aside made.
bool is_archive_name(const std::string& name);
// The moved-aside directory (previous_<time>) that `path` is or lies in,
// judged on its absolute path and on its real one (links resolved); "" when none.
std::string archive_of(const std::string& path);
// A checkpoint directory from what a user gave: a step_<N> dir (has
// index.json), a run's checkpoint root (follows latest), or the latest file.
// Throws dtrain::Error(checkpoint) naming the path when it is none of them.
std::string resolve(const std::string& path);
// The directory a checkpoint belongs to: for <root>/step_<N>, <root> (its
// `latest` and sibling steps are part of the run); for any other dir, itself.
std::string owning_root(const std::string& dir);
// Throws dtrain::Error(config) naming `field` when `out` lies inside `given`
// (what the user passed), the resolved checkpoint `dir`, or its owning_root:
// writing there would clobber the checkpoint being read.
void check_outside(const std::string& out, const std::string& field, const std::string& given,
                   const std::string& dir);

}  // namespace dtrain::checkpoint
