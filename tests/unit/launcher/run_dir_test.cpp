// Run directories belong to one job: RunDirLock (refusal naming the holder,
// sharing within one job, stale take-over) and prepare_checkpoint_start
// (fresh start beside old steps refused, --fresh and resuming from an older
// step move steps aside; nothing deleted, nothing overwritten).
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_writer.h"
#include "common/error.h"
#include "launcher/checkpoint_start.h"
#include "launcher/run_dir_lock.h"
#include "tests/support/child.h"

namespace fs = std::filesystem;
using namespace dtrain::launcher;
namespace ck = dtrain::checkpoint;

namespace {

using Tmp = dtrain::testing::TempDir;
using dtrain::testing::read_file;

template <typename F>
std::string config_error(F f) {
  try {
    f();
  } catch (const dtrain::Error& e) {
    CHECK(e.exit_code() == 2);
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A complete one-rank checkpoint <root>/step_<step> (index + rank file).
void write_step(const std::string& root, int64_t step) {
  const std::string dir = root + "/" + ck::step_dir_name(step);
  fs::create_directories(dir);
  static const std::vector<float> w = {1, 2, 3};
  ck::TensorEntry e{"model/w", "F32", {3}, {ck::Shard{"", "model/w", {{0, 3}}, 0}}};
  ck::write_rank_file(dir, "rank_0.safetensors", {{e, w.data()}});
  ck::Index idx;
  idx.step = step;
  idx.mesh = "dp=1,tp=1,pp=1,ep=1";
  idx.world = 1;
  idx.model = "toy";
  idx.files = {"rank_0.safetensors"};
  ck::write_index(dir, idx);
}

std::vector<std::string> previous_dirs(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind("previous_", 0) == 0) out.push_back(e.path().string());
  return out;
}

}  // namespace

TEST_CASE("run dir lock: a second job is refused with the holder, the same job shares") {
  Tmp t;
  const std::string dir = t / "run";
  LockOwner a = this_agent("job-a", job_id_of("job-a", "token-a", "n0:29400"), "host-a");
  auto first = std::make_unique<RunDirLock>(dir, "log.dir", a);
  CHECK(first->holds());
  CHECK(has(read_file(dir + "/" + kLockFile), "job=job-a"));

  LockOwner b = this_agent("job-b", job_id_of("job-b", "token-b", "n0:29400"), "host-a");
  std::string e = config_error([&] { RunDirLock second(dir, "log.dir", b); });
  CHECK(has(e, "log.dir = " + dir + ": is in use by job 'job-a' (pid " + std::to_string(getpid())));
  CHECK(has(e, "one job per run directory"));

  // Same name, another token: another job.
  LockOwner a2 = this_agent("job-a", job_id_of("job-a", "token-other", "n0:29400"), "host-b");
  CHECK(has(config_error([&] { RunDirLock other(dir, "log.dir", a2); }), "is in use"));

  // Same job (name and token): shared, not held.
  LockOwner a3 = this_agent("job-a", job_id_of("job-a", "token-a", "n0:29400"), "host-b");
  RunDirLock shared(dir, "checkpoint.dir", a3);
  CHECK_FALSE(shared.holds());
  CHECK(shared.holder().pid == getpid());

  first.reset();  // released: the next job takes it
  RunDirLock next(dir, "log.dir", b);
  CHECK(next.holds());
}

TEST_CASE("run dir lock: the same name and token at another rendezvous is another job") {
  Tmp t;
  const std::string dir = t / "run";
  LockOwner a = this_agent("job-a", job_id_of("job-a", "tok", "node0:29400"), "host-a", "node0:29400");
  RunDirLock first(dir, "log.dir", a);
  REQUIRE(first.holds());
  LockOwner b = this_agent("job-a", job_id_of("job-a", "tok", "node7:29400"), "host-b", "node7:29400");
  const std::string e = config_error([&] { RunDirLock second(dir, "log.dir", b); });
  CHECK(has(e, "is in use by job 'job-a'"));
  CHECK(has(e, "at rendezvous node0:29400 (this agent's: node7:29400)"));
  CHECK(has(e, "spell its endpoint the same way on every node"));
  // The same rendezvous, its host spelled in another case: the same job.
  LockOwner c = this_agent("job-a", job_id_of("job-a", "tok", "NODE0:29400"), "host-c", "NODE0:29400");
  RunDirLock shared(dir, "log.dir", c);
  CHECK_FALSE(shared.holds());
}

TEST_CASE("run dir lock: a lock left by a dead process is taken over") {
  Tmp t;
  pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);  // a pid that is surely dead now
  LockOwner dead = this_agent("old", "0000", "this-host");
  dead.pid = child;
  std::ofstream(t / kLockFile) << dead.to_text();
  RunDirLock lock(t.path(), "log.dir", this_agent("new", "1111", "this-host"));
  CHECK(lock.holds());
  CHECK(has(read_file(t / kLockFile), "job=new"));
}

TEST_CASE("run dir lock: a file or an unwritable path is refused naming the field") {
  Tmp t;
  std::ofstream(t / "file") << "x";
  LockOwner me = this_agent("j", "1", "h");
  CHECK(has(config_error([&] { RunDirLock l(t / "file", "checkpoint.dir", me); }),
            "checkpoint.dir = " + (t / "file") + ": exists and is not a directory"));
  CHECK(has(config_error([&] { RunDirLock l(t / "file/sub", "log.dir", me); }),
            "log.dir = " + (t / "file/sub") + ": cannot be created"));
}

TEST_CASE("checkpoint start: steps without latest refuse a fresh start, naming the choices") {
  Tmp t;
  const std::string root = t / "ckpt";
  CHECK(prepare_checkpoint_start(root, {}) == "");  // nothing there: fresh
  write_step(root, 10);
  write_step(root, 20);
  fs::create_directories(root + "/step_30");  // incomplete: no index
  const std::string index20 = read_file(root + "/step_20/index.json");
  std::string e = config_error([&] { prepare_checkpoint_start(root, {}); });
  CHECK(has(e, "checkpoint.dir = " + root + " holds step_10, step_20, step_30 but no `latest`"));
  CHECK(has(e, "--resume-from " + root + "/step_20"));  // the newest valid one
  CHECK(has(e, "--fresh"));
  CHECK(read_file(root + "/step_20/index.json") == index20);

  // A `latest` naming a missing step is no better.
  std::ofstream(root + "/latest") << "step_99\n";
  CHECK(has(config_error([&] { prepare_checkpoint_start(root, {}); }), "its `latest` is not valid"));

  // --fresh: everything moves into previous_<time>/, nothing is deleted.
  CHECK(prepare_checkpoint_start(root, {"", true}) == "");
  CHECK(ck::list_steps(root).empty());
  CHECK_FALSE(fs::exists(root + "/latest"));
  auto prev = previous_dirs(root);
  REQUIRE(prev.size() == 1);
  CHECK(read_file(prev[0] + "/step_20/index.json") == index20);
  CHECK(fs::is_directory(prev[0] + "/step_30"));
}

TEST_CASE("checkpoint start: resuming from an older step moves the newer ones aside") {
  Tmp t;
  const std::string root = t / "ckpt";
  for (int s : {10, 20, 30}) write_step(root, s);
  ck::set_latest(root, 30);
  // latest valid: a plain launch resumes from it and moves nothing.
  CHECK(prepare_checkpoint_start(root, {}) == root + "/step_30");
  CHECK(previous_dirs(root).empty());

  const std::string from = prepare_checkpoint_start(root, {root + "/step_10", false});
  CHECK(from == root + "/step_10");
  CHECK(ck::list_steps(root) == std::vector<int64_t>{10});
  CHECK(read_file(root + "/latest") == "step_10\n");  // an agent restart loads the same step
  auto prev = previous_dirs(root);
  REQUIRE(prev.size() == 1);
  CHECK(fs::exists(prev[0] + "/step_20/index.json"));
  CHECK(fs::exists(prev[0] + "/step_30/index.json"));

  CHECK(has(config_error([&] { prepare_checkpoint_start(root, {root + "/step_10", true}); }),
            "contradict"));
}

TEST_CASE("checkpoint start: resuming from another directory moves this one's steps aside") {
  Tmp t;
  write_step(t / "other", 5);
  write_step(t / "ckpt", 40);
  ck::set_latest(t / "ckpt", 40);
  CHECK(prepare_checkpoint_start(t / "ckpt", {t / "other/step_5", false}) == t / "other/step_5");
  CHECK(ck::list_steps(t / "ckpt").empty());
  CHECK_FALSE(fs::exists(t / "ckpt/latest"));
  CHECK(previous_dirs(t / "ckpt").size() == 1);
}
