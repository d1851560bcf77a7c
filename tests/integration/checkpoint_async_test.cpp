// checkpoint.async end to end with the real `dtrain`: the same rank files as
// a synchronous save, bitwise equal losses and resume, the ckpt_* metrics
// records, a SIGKILL of the writer thread mid-file (latest stays on the
// previous checkpoint, the relaunch resumes bit-exactly). The fixture is
// tests/support/checkpoint_run.h (shared with checkpoint_test.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/checkpoint_run.h"

using namespace dtrain::testing::ckpt_run;
using dtrain::testing::read_latest;

// An async save stops the step loop for its host copies only; a
// synchronous one for the write, the barriers and the commit. On the tests'
// tiny model the copies cost microseconds and a save milliseconds.
constexpr double kMaxAsyncBlockRatio = 0.5;

namespace {

// step -> {field -> value} of the ckpt_* fields of a run's metrics records
// (a checkpoint record follows its step's record; every step recorded is a key).
std::map<int, std::map<std::string, double>> read_ckpt_fields(const std::string& path) {
  std::map<int, std::map<std::string, double>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto s = line.find("\"step\": ");
    if (s == std::string::npos) continue;
    auto& fields = out[std::atoi(line.c_str() + s + 8)];
    for (const std::string name : {"ckpt_block_ms", "ckpt_write_ms"})
      if (auto p = line.find("\"" + name + "\": "); p != std::string::npos)
        fields[name] = std::strtod(line.c_str() + p + name.size() + 4, nullptr);
  }
  return out;
}

std::string fields_text(const std::map<int, std::map<std::string, double>>& m) {
  std::ostringstream out;
  for (const auto& [step, fields] : m)
    for (const auto& [name, v] : fields) out << "  step " << step << ": " << name << " " << v << "\n";
  return out.str();
}

}  // namespace

TEST_CASE("checkpoint.async: the same files as a synchronous save, bit-exact resume, ckpt_* metrics") {
  Fixture f;
  // log.every 7: steps 10 and 20 are not logging steps; their saves still add a record.
  Run sync = f.run("sync", {"log.every=7"});
  INFO(sync.output);
  REQUIRE(sync.code == 0);
  Run async = f.run("async", {"log.every=7", "checkpoint.async=true"});
  INFO(async.output);
  REQUIRE(async.code == 0);
  check_trained("async", async);
  // Training is not disturbed: every step's loss bitwise equal.
  INFO("sync:\n" << seq(sync.losses, 1, kSteps) << "async:\n" << seq(async.losses, 1, kSteps));
  for (const auto& [step, loss] : sync.losses) {  // async has more: the steps that committed
    CAPTURE(step);
    REQUIRE(async.losses.count(step));
    CHECK(std::memcmp(&loss, &async.losses.at(step), sizeof(double)) == 0);
  }
  // The rank files of every kept checkpoint are byte-identical.
  CHECK(read_latest(f.dir / "async/ckpt") == "step_30");
  for (const std::string step : {"step_10", "step_20", "step_30"})
    for (const std::string file : {"rank_0.safetensors", "rank_1.safetensors"}) {
      CAPTURE(step + "/" + file);
      REQUIRE(fs::exists(f.dir / "async/ckpt/" + step + "/index.json"));
      CHECK(dtrain::testing::read_file(f.dir / "sync/ckpt/" + step + "/" + file) ==
            dtrain::testing::read_file(f.dir / "async/ckpt/" + step + "/" + file));
    }

  // Metrics: a sync save reports both figures on its step. An async save
  // blocks at its step and its write is reported where it was committed: a
  // later step (the first save had nothing in flight to report), the last
  // step's own save waited for.
  const auto sm = read_ckpt_fields(f.dir / "sync/metrics.jsonl");
  const auto am = read_ckpt_fields(f.dir / "async/metrics.jsonl");
  INFO("sync ckpt fields:\n" << fields_text(sm) << "async ckpt fields:\n" << fields_text(am));
  for (int step : {10, 20, 30}) {
    CAPTURE(step);
    REQUIRE(sm.count(step));
    REQUIRE(am.count(step));
    CHECK(sm.at(step).count("ckpt_block_ms"));
    CHECK(sm.at(step).count("ckpt_write_ms"));
    CHECK(am.at(step).count("ckpt_block_ms"));
  }
  CHECK(am.at(10).count("ckpt_write_ms") == 0);
  CHECK(am.at(30).count("ckpt_write_ms") == 1);
  int async_writes = 0;
  for (const auto* m : {&sm, &am})
    for (const auto& [step, fields] : *m)
      for (const auto& [name, v] : fields) {
        CHECK(v >= 0);
        async_writes += m == &am && name == "ckpt_write_ms" && step > 10;
      }
  // Each save is committed once, after its own step (rank 0 logs each
  // commit); the last step may commit two (a slow write of step 20's and its own).
  size_t commits = 0;
  for (size_t p = 0; (p = async.output.find("committed (async)", p)) != std::string::npos; ++p) ++commits;
  CHECK(commits == 3);
  CHECK((async_writes == 3 || async_writes == 2));
  CHECK(am.count(9) == 0);   // not a logging step, no save: no record
  // Blocking as a ratio on this pair of runs: the step loop's stops for
  // checkpoints before the last step (the saves of steps 10 and 20, and any
  // commit of theirs), async over sync. The last step waits for its write in
  // both modes: left out.
  double sync_block = 0, async_block = 0;
  for (const auto* m : {&sm, &am})
    for (const auto& [step, fields] : *m)
      if (step < kSteps && fields.count("ckpt_block_ms"))
        (m == &sm ? sync_block : async_block) += fields.at("ckpt_block_ms");
  REQUIRE(sync_block > 0);
  const double block_ratio = async_block / sync_block;
  MESSAGE("ckpt_block_ms before step " << kSteps << ": sync " << sync_block << " ms, async " << async_block
                                       << " ms, ratio " << block_ratio << " (must be <= " << kMaxAsyncBlockRatio
                                       << ")");
  CHECK(block_ratio <= kMaxAsyncBlockRatio);

  // Resumed from the async run's step_20: steps 21..30 and the final
  // parameters bitwise equal to the synchronous run.
  Run resumed = f.run("resumed", {"log.every=7", "checkpoint.async=true"}, {}, f.dir / "async/ckpt/step_20");
  INFO(resumed.output);
  REQUIRE(resumed.code == 0);
  CHECK(resumed.output.find("resuming from step 20") != std::string::npos);
  REQUIRE(resumed.losses.count(kSteps));
  for (const auto& [step, loss] : resumed.losses) {
    CAPTURE(step);
    REQUIRE(sync.losses.count(step));
    CHECK(std::memcmp(&loss, &sync.losses.at(step), sizeof(double)) == 0);
  }
  const auto sync_p = f.params("sync");
  REQUIRE(!sync_p.empty());
  CHECK(f.params("resumed") == sync_p);
}

TEST_CASE("checkpoint.async: a crash while the writer thread writes leaves latest on the previous checkpoint") {
  Fixture f;
  Run crashed = f.run("crash", {"checkpoint.async=true", "fault.kind=crash_during_save", "fault.rank=1",
                                "fault.step=20"});
  INFO(crashed.output);
  REQUIRE(crashed.code != 0);
  const std::string root = f.dir / "crash/ckpt";
  CHECK(read_latest(root) == "step_10");
  CHECK(fs::exists(root + "/step_20.tmp/rank_1.safetensors"));  // the half-written shard
  CHECK(!fs::exists(root + "/step_20"));
  REQUIRE(crashed.losses.count(20));
  const std::map<int, double> first = crashed.losses;  // the relaunch appends to the same metrics file
  Run again = f.run("crash", {"checkpoint.async=true"});
  INFO(again.output);
  REQUIRE(again.code == 0);
  CHECK(again.output.find("resuming from step 10") != std::string::npos);
  CHECK(again.output.find("removed 1 unfinished .tmp") != std::string::npos);
  CHECK(read_latest(root) == "step_30");
  CHECK(!fs::exists(root + "/step_20.tmp"));
  check_trained("crashed + relaunched", again);
  // The relaunch redid steps 11.. from step_10: bitwise the losses the
  // crashed run logged for them (dropout on: model, AdamW, sampler and RNG
  // states all restored).
  INFO("crashed run:\n" << seq(first, 11, 20) << "relaunch:\n" << seq(again.losses, 11, 20));
  for (const auto& [step, loss] : first)
    if (step > 10) {
      CAPTURE(step);
      REQUIRE(again.losses.count(step));
      CHECK(std::memcmp(&loss, &again.losses.at(step), sizeof(double)) == 0);
    }
}

TEST_CASE("checkpoint.async with a checkpoint.dir that cannot be made: exit 2 naming it, no worker started") {
  Fixture f;
  dtrain::testing::write_file(f.dir / "afile", "x");
  const std::string bad = f.dir / "afile" + "/ckpt";
  Run r = f.run("refused", {"checkpoint.async=true", "checkpoint.dir=" + bad}, {}, "", /*keep_ckpt_dir=*/true);
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("checkpoint.dir = " + bad) != std::string::npos);
  CHECK_FALSE(fs::exists(f.dir / "refused/rank_0.log"));  // no worker ever started
}

namespace {

// A tmpfs of `bytes` at `dir` for the life of the object: a disk that fills up.
struct SmallTmpfs {
  std::string dir;
  bool mounted = false;
  SmallTmpfs(const std::string& d, uint64_t bytes) : dir(d) {
    fs::create_directories(dir);
    mounted = std::system(("mount -t tmpfs -o size=" + std::to_string(bytes) + " dtrain-test-full " + dir).c_str()) == 0;
  }
  ~SmallTmpfs() {
    if (mounted) (void)std::system(("umount -l " + dir).c_str());
  }
};

uint64_t dir_bytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

}  // namespace

TEST_CASE("checkpoint.async on a full disk: a failed save is logged and training goes on; the 3rd in a row stops") {
  Fixture f;
  // One checkpoint's size, from a run on a roomy disk.
  Run sized = f.run("sized", {"checkpoint.async=true", "train.steps=10"});
  INFO(sized.output);
  REQUIRE(sized.code == 0);
  const uint64_t one = dir_bytes(f.dir / "sized/ckpt/step_10");
  REQUIRE(one > 0);
  // Room for one checkpoint and half of another: the save of step 2 commits,
  // each later one runs out of space half-way (its partial files removed).
  const std::string root = f.dir / "full/ckpt";
  SmallTmpfs disk(root, one * 3 / 2);
  REQUIRE_MESSAGE(disk.mounted, "mount -t tmpfs needs root (the tests run as root)");
  Run r = f.run("full", {"checkpoint.async=true", "checkpoint.every=2", "checkpoint.dir=" + root}, {}, "",
                /*keep_ckpt_dir=*/true);
  INFO(r.output);
  MESSAGE("one checkpoint " << one << " bytes; tmpfs " << one * 3 / 2 << " bytes; trained to step "
                            << (r.losses.empty() ? 0 : r.losses.rbegin()->first) << ", exit " << r.code);
  CHECK(r.code != 0);  // the third failed save in a row stops the job
  CHECK(r.output.find("No space left on device") != std::string::npos);
  CHECK(r.output.find("training goes on (latest stays " + root + "/step_2; 1 failed save(s) in a row") !=
        std::string::npos);
  CHECK(r.output.find("2 failed save(s) in a row") != std::string::npos);
  CHECK(r.output.find("3 failed save(s) in a row") == std::string::npos);  // the 3rd is thrown, not logged
  // Training went on past the two failed saves (of steps 4 and 6), up to the third's (8).
  CHECK(r.losses.count(8) == 1);
  CHECK(read_latest(root) == "step_2");
  CHECK(fs::exists(root + "/step_2/index.json"));
  for (int s : {4, 6, 8}) {
    CHECK_FALSE(fs::exists(root + "/step_" + std::to_string(s)));
    CHECK_FALSE(fs::exists(root + "/step_" + std::to_string(s) + ".tmp"));  // its space given back
  }
}
