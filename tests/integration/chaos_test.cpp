// Faults and their recovery: an automatic resume falls back past a corrupt
// newest checkpoint (naming it) while an explicit resume refuses it. The
// seeded chaos campaign (bench/chaos/chaos.py) is not run here yet: its
// CI-sized runs still fail now and then, for open reasons in the harness
// and the engine (bench/chaos/README.md).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "tests/support/child.h"
#include "tests/support/parity.h"

namespace parity = dtrain::testing::parity;
namespace fs = std::filesystem;

namespace {

using parity::step_losses;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Flips the last byte of every rank file of a checkpoint step (tensor data,
// not the header): its checksum no longer matches the index.
int corrupt_step(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("a corrupt newest checkpoint: the automatic resume falls back to the newest that verifies; "
          "an explicit resume refuses it") {
  auto& p = parity::Parity::get();
  const std::string run = p.dir / "corrupt_latest";
  // Every run has train.steps 8 (the learning-rate schedule depends on it,
  // and the redone steps must see the same one).
  auto launch = [&](const std::string& name, std::vector<std::string> args = {}, int restarts = 1) {
    std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "launch", p.dir / "spec.yaml"};
    argv.insert(argv.end(), args.begin(), args.end());
    for (const std::string& s :
         {"log.dir=" + run, "checkpoint.dir=" + run + "/ckpt", std::string("checkpoint.every=2"),
          std::string("checkpoint.keep=10"), std::string("train.steps=8"),
          "cluster.max_restarts=" + std::to_string(restarts),
          "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(dtrain::testing::free_port())})
      argv.insert(argv.end(), {"--set", s});
    return dtrain::testing::run_command(argv, p.dir / (name + ".log"), 120);
  };
  // The first run dies after step 6 and its checkpoint (no restart).
  auto [code, out] = launch("corrupt_latest_a", {"--set", "fault.kind=kill_after_step", "--set", "fault.step=6"}, 0);
  REQUIRE_MESSAGE(code != 0, out);
  const auto first = step_losses(run + "/metrics.jsonl");
  REQUIRE(first.size() == 6);
  REQUIRE(corrupt_step(run + "/ckpt/step_6") == 1);

  // Explicit: refused, naming the checksum.
  std::tie(code, out) = launch("corrupt_latest_explicit", {"--resume-from", run + "/ckpt/step_6"});
  CHECK_MESSAGE(code != 0, out);
  CHECK_MESSAGE(has(out, "checksum mismatch"), out);
  CHECK_MESSAGE(!has(out, "skipped step_6"), out);
  CHECK_MESSAGE(has(out, "this run was started with --resume-from, so its restarts do not fall back"), out);

  // Automatic (the run dir's `latest`): step_6 is skipped, named, and the
  // run goes on from step_4, redoing 5 and 6 exactly.
  std::tie(code, out) = launch("corrupt_latest_b");
  INFO(out);
  REQUIRE(code == 0);
  CHECK(has(out, "checkpoint: skipped step_6: "));
  CHECK(has(out, "checksum mismatch"));
  CHECK(has(out, "checkpoint: resuming from step_4, the newest step that verifies, instead of `latest` (step_6)"));
  CHECK(has(out, "resuming from step 4 "));
  const auto all = step_losses(run + "/metrics.jsonl");
  REQUIRE(all.size() == 6 + 4);  // 1..6, then 5..8
  double worst = 0;
  for (size_t i = 0; i < 4; ++i) CHECK(all[6 + i].first == 5 + int(i));
  for (size_t i = 0; i < 2; ++i)
    worst = std::max(worst, std::fabs(all[6 + i].second - first[4 + i].second) / std::fabs(first[4 + i].second));
  MESSAGE("fallback to step 4: steps 5-6 redone, max loss rel diff vs their first run " << worst << " (tolerance "
                                                                                        << parity::kLossRelTol << ")");
  CHECK(worst <= parity::kLossRelTol);
}
