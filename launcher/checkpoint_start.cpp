// prepare_checkpoint_start (checkpoint_start.h). Every move is a rename into
// previous_<time>/ inside the same checkpoint.dir: nothing is deleted here.
#include "launcher/checkpoint_start.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_index.h"
#include "common/checkpoint_reader.h"
#include "common/error.h"
#include "common/log.h"
#include "common/safetensors.h"

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
                                     bool latest_exists, const std::string& why = "") {
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
              "checkpoint.dir = " + root + " holds " + (steps.empty() ? "no steps" : step_list(steps)) +
                  " but " + (latest_exists ? "its `latest` is not valid" : "no `latest`") +
                  ": starting from scratch would overwrite them" + (why.empty() ? "" : " (" + why + ")"),
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
    const std::string path = dir + "/" + ck::kIndexFile;
    return ck::index_from_json(safetensors::read_regular(path, "checkpoint index", ck::kMaxIndexBytes), path).step;
  } catch (const std::exception&) {
  }
  const std::string name = fs::path(dir).filename().string();
  return name.rfind("step_", 0) == 0 ? std::atoll(name.c_str() + 5) : 0;
}

// What a start does to root, decided without touching it.
struct StartPlan {
  std::string from;                 // the checkpoint the workers load ("" = none)
  bool move_all = false;            // every step and `latest` aside
  std::string move_all_why;
  std::vector<int64_t> newer;       // steps newer than `from`, aside
  int64_t step = 0;                 // `from`'s step
  bool point_latest = false;        // `latest` set to `from` (a step of root)
};

[[noreturn]] void refuse_archive(const std::string& root, const std::string& archive,
                                 const std::string& resume_from) {
  const std::string live = fs::path(archive).parent_path().string();
  throw Error(ErrorCode::config,
              "checkpoint.dir = " + root + (canonical(root) == canonical(archive) ? " is " : " lies in ") +
                  archive + ", a directory of steps moved aside: it is never written to or pruned, so "
                  "a run cannot continue there",
              "continue in the live directory, reading the archived step without changing it: " +
                  (resume_from.empty()
                       ? "--resume-from " + archive + "/step_<N> --set checkpoint.dir=" + live
                       : "dtrain resume --ckpt " + resume_from + " --set checkpoint.dir=" + live) +
                  " (the live steps there are moved aside first), or copy the step out of the archive");
}

StartPlan plan_start(const std::string& root, const CheckpointStart& start) {
  if (start.fresh && !start.resume_from.empty())
    throw Error(ErrorCode::config, "--fresh and --resume-from " + start.resume_from +
                                       " contradict each other",
                "give one: --fresh starts from scratch, --resume-from continues a checkpoint");
  StartPlan plan;
  plan.from = start.resume_from.empty() ? "" : ck::resolve(start.resume_from);
  if (root.empty()) return plan;
  if (const std::string archive = ck::archive_of(root); !archive.empty())
    refuse_archive(root, archive, start.resume_from);
  const std::vector<int64_t> steps = ck::list_steps(root);
  if (start.fresh) {
    plan.move_all = true;
    plan.move_all_why = "--fresh";
    return plan;
  }
  const bool latest_exists = fs::exists(fs::symlink_status(root + "/" + ck::kLatestFile));
  if (plan.from.empty() && latest_exists) {
    try {
      plan.from = ck::latest_dir(root);
    } catch (const Error& e) {
      refuse_fresh_start(root, steps, true, e.message());
    }
  }
  if (plan.from.empty()) {
    if (!steps.empty()) refuse_fresh_start(root, steps, latest_exists);
    return plan;
  }
  if (canonical(ck::owning_root(plan.from)) != canonical(root)) {
    // Resuming from another run (or from an archive): this directory's steps
    // are not its past; the checkpoint read is left as it is.
    plan.move_all = true;
    plan.move_all_why = "resuming from " + plan.from + ", another checkpoint directory";
    return plan;
  }
  plan.step = step_of(plan.from);
  std::copy_if(steps.begin(), steps.end(), std::back_inserter(plan.newer),
               [&](int64_t s) { return s > plan.step; });
  if (canonical(plan.from) == canonical(root + "/" + ck::step_dir_name(plan.step))) {
    std::string current;
    try {
      current = latest_exists ? ck::latest_dir(root) : "";
    } catch (const Error&) {
    }
    plan.point_latest = current.empty() || canonical(current) != canonical(plan.from);
  }
  return plan;
}

}  // namespace

void check_checkpoint_start(const std::string& root, const CheckpointStart& start) {
  plan_start(root, start);
}

std::string prepare_checkpoint_start(const std::string& root, const CheckpointStart& start) {
  const StartPlan plan = plan_start(root, start);
  if (root.empty()) return plan.from;
  if (plan.move_all) move_all_aside(root, ck::list_steps(root), plan.move_all_why);
  if (!plan.newer.empty()) {
    const std::string aside = ck::move_aside(root, names_of(plan.newer));
    DTRAIN_WARN("checkpoint.dir = {}: resuming from {}: moved the newer {} into {}", root,
                ck::step_dir_name(plan.step), step_list(plan.newer), aside);
  }
  if (plan.point_latest) ck::set_latest(root, plan.step);
  return plan.from;
}

}  // namespace dtrain::launcher
