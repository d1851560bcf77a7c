// prepare_checkpoint_start (checkpoint_start.h). Every move is a rename into
// previous_<time>/ inside the same checkpoint.dir: nothing is deleted here.
#include "launcher/checkpoint_start.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_index.h"
#include "common/checkpoint_reader.h"
#include "common/error.h"
#include "common/log.h"

namespace dtrain::launcher {
namespace fs = std::filesystem;
namespace ck = dtrain::checkpoint;
namespace {

std::string canonical(const std::string& path) {
  std::error_code ec;
  auto p = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? fs::absolute(path).lexically_normal().string() : p.string();
}

bool is_valid(const std::string& dir) {
  try {
    ck::CheckpointReader reader(dir);  // index present, every rank file there
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string step_list(const std::vector<int64_t>& steps) {
  std::string out;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i == 3 && steps.size() > 5) {
      out += ", ... (" + std::to_string(steps.size() - 4) + " more)";
      i = steps.size() - 1;
    }
    out += (out.empty() ? "" : ", ") + ck::step_dir_name(steps[i]);
  }
  return out;
}

[[noreturn]] void refuse_fresh_start(const std::string& root, const std::vector<int64_t>& steps,
                                     bool latest_exists) {
  std::string newest;
  for (auto it = steps.rbegin(); it != steps.rend() && newest.empty(); ++it)
    if (is_valid(root + "/" + ck::step_dir_name(*it))) newest = root + "/" + ck::step_dir_name(*it);
  std::string hint =
      newest.empty()
          ? "none of them is a complete checkpoint: start afresh with --fresh (moves them aside "
            "into " + root + "/previous_<time>/), or give this job another checkpoint.dir"
          : "resume from the newest valid step with --resume-from " + newest +
                " (or dtrain resume --ckpt " + newest + "), or start afresh with --fresh (moves "
                "the old steps aside into " + root + "/previous_<time>/)";
  throw Error(ErrorCode::config,
              "checkpoint.dir = " + root + " holds " + step_list(steps) + " but " +
                  (latest_exists ? "its `latest` is not valid" : "no `latest`") +
                  ": starting from scratch would overwrite them",
              hint);
}

std::vector<std::string> names_of(const std::vector<int64_t>& steps) {
  std::vector<std::string> names;
  for (int64_t s : steps) names.push_back(ck::step_dir_name(s));
  return names;
}

// Everything a fresh start must not write over: every step and `latest`.
void move_all_aside(const std::string& root, const std::vector<int64_t>& steps,
                    const std::string& why) {
  std::vector<std::string> names = names_of(steps);
  if (fs::exists(fs::symlink_status(root + "/" + ck::kLatestFile)))
    names.push_back(ck::kLatestFile);
  if (names.empty()) return;
  const std::string aside = ck::move_aside(root, names);
  DTRAIN_WARN("checkpoint.dir = {}: {}: moved {} into {}", root, why,
              steps.empty() ? std::string("latest") : step_list(steps), aside);
}

// The step a checkpoint holds: its index's, else its name's. Validity of the
// shards is for the loader to report (with the file and tensor at fault).
int64_t step_of(const std::string& dir) {
  try {
    std::ifstream in(dir + "/" + ck::kIndexFile);
    std::stringstream text;
    text << in.rdbuf();
    return ck::index_from_json(text.str(), dir).step;
  } catch (const std::exception&) {
  }
  const std::string name = fs::path(dir).filename().string();
  return name.rfind("step_", 0) == 0 ? std::atoll(name.c_str() + 5) : 0;
}

}  // namespace

std::string prepare_checkpoint_start(const std::string& root, const CheckpointStart& start) {
  if (start.fresh && !start.resume_from.empty())
    throw Error(ErrorCode::config, "--fresh and --resume-from " + start.resume_from +
                                       " contradict each other",
                "give one: --fresh starts from scratch, --resume-from continues a checkpoint");
  std::string from = start.resume_from.empty() ? "" : ck::resolve(start.resume_from);
  if (root.empty()) return from;
  const std::vector<int64_t> steps = ck::list_steps(root);
  if (start.fresh) {
    move_all_aside(root, steps, "--fresh");
    return "";
  }
  const bool latest_exists = fs::exists(fs::symlink_status(root + "/" + ck::kLatestFile));
  if (from.empty() && latest_exists) {
    try {
      from = ck::latest_dir(root);
    } catch (const Error&) {
      refuse_fresh_start(root, steps, true);
    }
  }
  if (from.empty()) {
    if (!steps.empty()) refuse_fresh_start(root, steps, latest_exists);
    return "";
  }
  if (canonical(ck::owning_root(from)) != canonical(root)) {
    // Resuming from another run: this directory's steps are not its past.
    move_all_aside(root, steps, "resuming from " + from + ", another checkpoint directory");
    return from;
  }
  const int64_t step = step_of(from);
  std::vector<int64_t> newer;
  std::copy_if(steps.begin(), steps.end(), std::back_inserter(newer),
               [&](int64_t s) { return s > step; });
  if (!newer.empty()) {
    const std::string aside = ck::move_aside(root, names_of(newer));
    DTRAIN_WARN("checkpoint.dir = {}: resuming from {}: moved the newer {} into {}", root,
                ck::step_dir_name(step), step_list(newer), aside);
  }
  if (canonical(from) == canonical(root + "/" + ck::step_dir_name(step))) {
    std::string current;
    try {
      current = latest_exists ? ck::latest_dir(root) : "";
    } catch (const Error&) {
    }
    if (current.empty() || canonical(current) != canonical(from)) ck::set_latest(root, step);
  }
  return from;
}

}  // namespace dtrain::launcher
