// newest_verified (resume_fallback.h). Rank 0 alone reads the candidates
// (one full read with checksums each, newest first, stopping at the first
// that verifies) and broadcasts the step it chose: every rank then loads the
// same checkpoint, which per-rank verification could not promise.
#include "engine/checkpoint/resume_fallback.h"

#include <ATen/ops/full.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_reader.h"
#include "common/error.h"
#include "common/log.h"

namespace dtrain::engine::checkpoint {

namespace ck = dtrain::checkpoint;

namespace {

// Rank 0: the newest step <= latest's that verifies (-1: none); `tried` gets
// "step_N: why" for each one skipped.
int64_t choose(const std::string& root, int64_t latest_step, bool fall_back, std::vector<std::string>* tried) {
  std::vector<int64_t> steps = ck::list_steps(root);
  steps.erase(std::remove_if(steps.begin(), steps.end(),
                             [&](int64_t st) { return st > latest_step || (!fall_back && st != latest_step); }),
              steps.end());
  if (std::find(steps.begin(), steps.end(), latest_step) == steps.end()) steps.push_back(latest_step);
  std::sort(steps.rbegin(), steps.rend());
  for (int64_t step : steps) {
    const std::string dir = root + "/" + ck::step_dir_name(step);
    try {
      ck::CheckpointReader reader(dir);
      reader.verify_all();
      return step;
    } catch (const Error& e) {
      tried->push_back(ck::step_dir_name(step) + ": " + e.message());
    }
  }
  return -1;
}

}  // namespace

namespace {
std::thread& verifier() {
  static std::thread t;
  return t;
}
}  // namespace

void verify_in_background(const std::string& latest_dir) {
  std::thread& t = verifier();
  if (t.joinable()) t.join();
  t = std::thread([latest_dir] {
    std::string why;
    try {
      ck::CheckpointReader reader(latest_dir);
      reader.verify_all();
      return;
    } catch (const Error& e) {
      why = e.message();
    } catch (const std::exception& e) {
      why = e.what();
    }
    std::error_code ec;
    if (!std::filesystem::exists(latest_dir, ec)) return;  // pruned meanwhile (checkpoint.keep): nothing to say
    DTRAIN_WARN("checkpoint: {} does not verify: {} (the restore came from the nodes' memory and did not read it; "
                "a restart from disk will skip it)",
                std::filesystem::path(latest_dir).filename().string(), why);
  });
}

BackgroundVerifyScope::~BackgroundVerifyScope() {
  if (verifier().joinable()) verifier().join();
}

std::string newest_verified(const TrainState& s, const std::string& latest, bool fall_back) {
  const std::string root = s.spec->checkpoint.dir;
  int64_t latest_step = 0;
  const std::string name = std::filesystem::path(latest).filename().string();
  if (name.rfind("step_", 0) == 0) latest_step = std::atoll(name.c_str() + 5);
  std::vector<std::string> tried;
  int64_t chosen = -1;
  if (s.info->rank == 0) {
    chosen = choose(root, latest_step, fall_back, &tried);
    if (fall_back)
      for (const auto& t : tried) DTRAIN_WARN("checkpoint: skipped {} (it does not verify)", t);
    if (chosen >= 0 && chosen != latest_step)
      DTRAIN_WARN("checkpoint: resuming from {}, the newest step that verifies, instead of `latest` ({})",
                  ck::step_dir_name(chosen), ck::step_dir_name(latest_step));
  }
  at::Tensor t = at::full({1}, double(chosen), at::kDouble);  // exact for any step count
  s.control->broadcast(t, 0);
  chosen = int64_t(t.item<double>());
  if (chosen < 0 && !fall_back)
    throw Error(ErrorCode::checkpoint,
                "`latest` of " + root + " does not verify" + (tried.empty() ? "" : ": " + tried.front()) +
                    "; this run was started with --resume-from, so its restarts do not fall back to an older step",
                "resume explicitly from a step you trust (--resume-from " + root + "/step_<N>)");
  if (chosen < 0) {
    std::string list;
    for (const auto& x : tried) list += "\n  " + x;
    throw Error(ErrorCode::checkpoint,
                "no checkpoint in " + root + " verifies" + (list.empty() ? " (rank 0 says which)" : ":" + list),
                "start afresh with dtrain launch SPEC --fresh (moves the old steps aside), or resume "
                "from a copy you trust with --resume-from DIR");
  }
  return root + "/" + ck::step_dir_name(chosen);
}

}  // namespace dtrain::engine::checkpoint
