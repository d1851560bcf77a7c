// Nothing lost, nothing clobbered, with the real `dtrain`: ckpt merge's
// refusals (an existing OUT, OUT inside the checkpoint, OUT a symlink), one
// rendezvous server per port, a fresh start beside old steps refused, one job
// per run directory (a concurrent launch refused, metrics.jsonl whole), logs
// appended across relaunches, bad input refused before any work starts
// (exit 2 naming the field, at about the CPU cost of validating a good spec,
// in under 100 MB), and the spec's faults that do not crash: a slow rank
// (its steps longer in metrics.jsonl) and a hung one (the run stops
// advancing; SIGTERM to dtrain leaves no process behind).
#include <doctest/doctest.h>

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/train_run.h"

namespace {

namespace fs = std::filesystem;
using dtrain::testing::Child;
using dtrain::testing::TagGuard;
using dtrain::testing::wait_until;
using dtrain::testing::TempDir;
using dtrain::testing::free_port;
using dtrain::testing::read_file;
using dtrain::testing::write_file;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// One run of dtrain with its own rusage (wait4), so the memory measured is
// this process tree's, not that of earlier tests' workers.
struct Measured {
  int code = -1;
  std::string output;
  double seconds = 0;
  double cpu_s = 0;  // user + system
  long max_rss_kb = 0;
};

Measured run_measured(std::vector<std::string> args, const std::string& out_path,
                      double timeout_s = 30) {
  args.insert(args.begin(), dtrain::testing::dtrain_bin());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&actions);
  Measured m;
  int status = 0;
  rusage ru{};
  for (;;) {
    pid_t r = wait4(pid, &status, WNOHANG, &ru);
    if (r == pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      ::kill(pid, SIGKILL);
      wait4(pid, &status, 0, &ru);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  m.max_rss_kb = ru.ru_maxrss;
  m.cpu_s = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
            1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  m.output = read_file(out_path);
  return m;
}

// A tiny GPT on one process, checkpoints every 2 steps into <dir>/ckpt.
struct Trainer {
  TempDir dir;
  TagGuard tag;
  Trainer() {
    write_file(dir / "text.txt",
               dtrain::testing::word_salad(16 * 1024, {"nothing ", "is ", "lost ", "or ",
                                                       "clobbered\n"}));
    write_file(dir / "spec.yaml",
               "job: {name: safety, seed: 7}\n"
               "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
               "model: {kind: gpt, vocab: 256, layers: 1, d_model: 16, heads: 2, seq_len: 16}\n"
               "train: {steps: 4, micro_batch: 2, lr: 1.0e-3, warmup_steps: 1}\n"
               "data: {path: " + (dir / "text.txt") + ", format: bytes}\n"
               "checkpoint: {dir: " + (dir / "ckpt") + ", every: 2, keep: 5}\n"
               "log: {dir: " + (dir / "run") + ", every: 1}\n");
  }
  std::string ckpt() const { return dir / "ckpt"; }
  std::vector<std::string> env() const { return {tag.env(), "DTRAIN_NO_REBUILD=1"}; }
  std::vector<std::string> launch_args(std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml",
                                  "--set", "cluster.rendezvous.endpoint=127.0.0.1:" +
                                               std::to_string(free_port())};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::pair<int, std::string> launch(std::vector<std::string> extra, const std::string& name) {
    return dtrain::testing::run_command(launch_args(std::move(extra)), dir / (name + ".out"), 180,
                                        env());
  }
  std::pair<int, std::string> dtrain(std::vector<std::string> args, const std::string& name) {
    args.insert(args.begin(), dtrain::testing::dtrain_bin());
    return dtrain::testing::run_command(args, dir / (name + ".out"), 60, env());
  }
  // Trains the 4 steps: step_2, step_4, latest.
  void train_once() {
    auto [code, out] = launch({}, "train");
    REQUIRE_MESSAGE(code == 0, out);
    REQUIRE(fs::is_regular_file(ckpt() + "/step_4/index.json"));
  }
};

std::vector<std::string> previous_dirs(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind("previous_", 0) == 0) out.push_back(e.path().string());
  return out;
}

}  // namespace

// step -> step_time_s of a run's metrics.jsonl (log.every 1: one step each).
std::map<int, double> step_times(const std::string& path) {
  std::map<int, double> out;
  std::istringstream lines(read_file(path));
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    // Whole step records only (checkpoint records carry no step_time_s).
    if (j.is_object() && j.contains("step_time_s")) out[j["step"].get<int>()] = j["step_time_s"].get<double>();
  }
  return out;
}

TEST_CASE("fault.kind slow: the slow rank's steps from fault.step on take fault.ms longer") {
  Trainer t;
  const int ms = 400;
  auto [code, out] = t.launch({"--set", "fault.kind=slow", "--set", "fault.rank=0", "--set",
                               "fault.step=3", "--set", "fault.ms=" + std::to_string(ms)},
                              "slow");
  REQUIRE_MESSAGE(code == 0, out);
  CHECK(has(out, "fault.kind = slow (rank 0, step 3, 400 ms)"));
  auto times = step_times(t.dir / "run/metrics.jsonl");
  REQUIRE(times.size() == 4);
  std::string seen;
  for (auto [step, s] : times) seen += " " + std::to_string(step) + ": " + std::to_string(s) + " s";
  MESSAGE("step_time_s with fault.ms = " << ms << " from step 3:" << seen);
  // Steps 1-2 are the control; 3-4 hold the sleep: at least fault.ms each,
  // and fault.ms (half of it, for load) over the control's pace.
  CHECK(times[3] >= ms / 1000.0);
  CHECK(times[4] >= ms / 1000.0);
  CHECK((times[3] + times[4]) / 2 - (times[1] + times[2]) / 2 >= 0.5 * ms / 1000.0);
}

TEST_CASE("fault.kind hang: the run stops after fault.step, SIGTERM ends it with no process left") {
  Trainer t;
  const auto launched = std::chrono::steady_clock::now();
  Child dtrain(t.launch_args({"--set", "cluster.procs_per_node=2", "--set", "parallel.dp=2",
                              "--set", "cluster.grace_s=1", "--set", "cluster.max_restarts=0",
                              "--set", "train.steps=20", "--set", "fault.kind=hang", "--set",
                              "fault.rank=1", "--set", "fault.step=2"}),
               t.dir / "hang.out", t.env());
  const std::string metrics = t.dir / "run/metrics.jsonl";
  REQUIRE_MESSAGE(wait_until([&] { return step_times(metrics).count(2) == 1; }, 60), dtrain.output());
  // Unhung, the 18 steps left take about 18 x step 2's time; hung, nothing
  // moves. Watch for a step 3 as long as this run took to reach step 2
  // (start-up included: its own pace, not a fixed bound), and at least
  // 10 x those 18 steps, failing as soon as one is logged.
  const double to_step2_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - launched).count();
  const double step_s = step_times(metrics).at(2);
  const double window_s = std::max(to_step2_s, 10 * 18 * step_s);
  const bool moved = wait_until([&] { return step_times(metrics).size() > 2 || !dtrain.running(); }, window_s);
  MESSAGE("step 2 took " << step_s << " s, " << to_step2_s << " s from the launch; watched " << window_s
                         << " s for a step 3");
  CHECK_FALSE(moved);
  CHECK(dtrain.running());
  CHECK(step_times(metrics).size() == 2);
  CHECK(has(read_file(t.dir / "run/rank_1.log"), "fault.kind = hang: rank 1 stops after step 2"));
  auto workers = dtrain::testing::tagged_pids(t.tag.tag());
  CHECK(workers.size() >= 3);  // dtrain and its two workers

  dtrain.signal(SIGTERM);  // the hung rank ignores it: the launcher's SIGKILL after grace_s
  REQUIRE_MESSAGE(dtrain.wait(15), dtrain.output());
  CHECK(dtrain.exit_code() == 128 + SIGTERM);
  CHECK_MESSAGE(wait_until([&] { return dtrain::testing::tagged_pids(t.tag.tag()).empty(); }, 5),
                dtrain::testing::tagged_pids(t.tag.tag()).size() << " tagged processes left");
}

TEST_CASE("ckpt merge: refuses an existing OUT, OUT inside the checkpoint, OUT a symlink") {
  Trainer t;
  t.train_once();
  const std::string latest = read_file(t.ckpt() + "/latest");
  const std::string index = read_file(t.ckpt() + "/step_4/index.json");

  write_file(t.dir / "existing.safetensors", "precious\n");
  auto [code, out] = t.dtrain({"ckpt", "merge", t.ckpt(), t.dir / "existing.safetensors"}, "m1");
  CHECK(code == 2);
  CHECK_MESSAGE(has(out, "OUT = " + (t.dir / "existing.safetensors") + " already exists"), out);
  CHECK(has(out, "--force"));
  CHECK(read_file(t.dir / "existing.safetensors") == "precious\n");

  for (const std::string& inside : {t.ckpt() + "/latest", t.ckpt() + "/step_4/index.json",
                                    t.ckpt() + "/merged.safetensors"}) {
    CAPTURE(inside);
    auto [c, o] = t.dtrain({"ckpt", "merge", t.ckpt(), inside, "--force"}, "m2");
    CHECK(c == 2);
    CHECK_MESSAGE(has(o, "inside the checkpoint being read"), o);
  }
  auto [c3, o3] = t.dtrain({"ckpt", "merge", t.ckpt() + "/step_4", t.ckpt() + "/latest"}, "m3");
  CHECK(c3 == 2);
  CHECK_MESSAGE(has(o3, "inside the checkpoint being read"), o3);
  CHECK(read_file(t.ckpt() + "/latest") == latest);
  CHECK(read_file(t.ckpt() + "/step_4/index.json") == index);
  CHECK_FALSE(fs::exists(t.ckpt() + "/merged.safetensors"));

  write_file(t.dir / "target.txt", "not a checkpoint\n");
  fs::create_symlink(t.dir / "target.txt", t.dir / "link.safetensors");
  for (const char* force : {"--with-optimizer", "--force"}) {
    auto [c, o] = t.dtrain({"ckpt", "merge", t.ckpt(), t.dir / "link.safetensors", force}, "m4");
    CHECK(c == 2);
    CHECK_MESSAGE(has(o, "is a symbolic link"), o);
  }
  CHECK(read_file(t.dir / "target.txt") == "not a checkpoint\n");

  // The allowed cases: a new file, and --force over a regular file.
  auto [c5, o5] = t.dtrain({"ckpt", "merge", t.ckpt(), t.dir / "new.safetensors"}, "m5");
  CHECK_MESSAGE(c5 == 0, o5);
  auto [c6, o6] = t.dtrain({"ckpt", "merge", t.ckpt(), t.dir / "existing.safetensors", "--force"}, "m6");
  CHECK_MESSAGE(c6 == 0, o6);
  CHECK(read_file(t.dir / "existing.safetensors") == read_file(t.dir / "new.safetensors"));
  for (const auto& e : fs::directory_iterator(t.dir.path()))  // no temporaries left
    CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);
}

TEST_CASE("checkpoints: a fresh start beside steps without latest is refused; --fresh moves them aside") {
  Trainer t;
  t.train_once();
  const std::string index4 = read_file(t.ckpt() + "/step_4/index.json");
  fs::remove(t.ckpt() + "/latest");  // as an old error message suggested
  auto [code, out] = t.launch({}, "again");
  CHECK(code == 2);
  CHECK_MESSAGE(has(out, "checkpoint.dir = " + t.ckpt() + " holds step_2, step_4 but no `latest`"), out);
  CHECK(has(out, "--resume-from " + t.ckpt() + "/step_4"));
  CHECK(has(out, "--fresh"));
  CHECK(read_file(t.ckpt() + "/step_4/index.json") == index4);

  auto [c2, o2] = t.launch({"--fresh"}, "fresh");
  CHECK_MESSAGE(c2 == 0, o2);
  auto prev = previous_dirs(t.ckpt());
  REQUIRE(prev.size() == 1);
  CHECK(read_file(prev[0] + "/step_4/index.json") == index4);
  CHECK(fs::is_regular_file(t.ckpt() + "/step_4/index.json"));  // the new run's
  CHECK(read_file(t.ckpt() + "/latest") == "step_4\n");

  // Resuming from an older step moves the newer one aside instead of writing over it.
  const std::string new4 = read_file(t.ckpt() + "/step_4/index.json");
  auto [c3, o3] = t.dtrain({"resume", "--ckpt", t.ckpt() + "/step_2", "--set",
                            "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port()),
                            "--set", "log.dir=" + (t.dir / "run"), "--set", "data.path=" + (t.dir / "text.txt")},
                           "resume");
  CHECK_MESSAGE(c3 == 0, o3);
  CHECK_MESSAGE(has(o3, "moved the newer step_4"), o3);
  prev = previous_dirs(t.ckpt());
  CHECK(prev.size() == 2);
  bool kept = false;
  for (const auto& p : prev) kept = kept || (fs::exists(p + "/step_4/index.json") && read_file(p + "/step_4/index.json") == new4);
  CHECK(kept);
}

TEST_CASE("one job per run directory: a concurrent launch is refused, metrics.jsonl stays valid") {
  Trainer t;
  auto first_args = t.launch_args({"--set", "train.steps=400", "--set", "checkpoint.every=100"});
  Child first(first_args, t.dir / "first.out", t.env());
  REQUIRE_MESSAGE(wait_until([&] { return has(read_file(t.dir / "run/.dtrain.lock"), "job_id="); }, 60),
                  first.output());
  auto [code, out] = t.launch({}, "second");
  CHECK(code == 2);
  CHECK_MESSAGE(has(out, "is in use by job 'safety' (pid " + std::to_string(first.pid())), out);
  REQUIRE(first.wait(240));
  CHECK_MESSAGE(first.exit_code() == 0, first.output());
  std::istringstream lines(read_file(t.dir / "run/metrics.jsonl"));
  int n = 0, bad = 0, steps = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    if (!nlohmann::json::accept(line)) ++bad;
    if (line.find("\"loss\": ") != std::string::npos) ++steps;  // step records (not checkpoint records)
  }
  CHECK(steps == 400);
  CHECK_MESSAGE(bad == 0, bad << " of " << n << " metrics lines are not JSON");
  // Ended: a relaunch of the same job is a resume, not a second job.
  auto [c2, o2] = t.launch({"--set", "train.steps=400"}, "relaunch");
  CHECK_MESSAGE(c2 == 0, o2);
}

TEST_CASE("relaunch appends to rank logs with a separator naming the run") {
  TempDir dir;
  TagGuard tag;
  write_file(dir / "spec.yaml",
             "job: {name: logs}\ncluster: {nodes: 1, procs_per_node: 1}\n"
             "log: {dir: " + (dir / "run") + "}\n"
             "entrypoint: [sh, -c, 'echo output of $DTRAIN_TEST_MARK']\n");
  for (const char* mark : {"first", "second"}) {
    auto [code, out] = dtrain::testing::run_command(
        {dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml", "--set",
         "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())},
        dir / (std::string(mark) + ".out"), 60, {tag.env(), std::string("DTRAIN_TEST_MARK=") + mark});
    REQUIRE_MESSAGE(code == 0, out);
  }
  const std::string log = read_file(dir / "run/rank_0.log");
  INFO(log);
  CHECK(has(log, "output of first"));
  CHECK(has(log, "output of second"));
  CHECK(log.find("output of first") < log.find("output of second"));
  size_t separators = 0;
  for (size_t p = 0; (p = log.find("===== dtrain: job 'logs' run of ", p)) != std::string::npos; ++p)
    ++separators;
  CHECK(separators == 2);
  CHECK(has(log, "restart 0, rank 0 ====="));
}

TEST_CASE("rendezvous: a second server on the same port fails at once, naming the first") {
  TempDir dir;
  TagGuard tag;
  write_file(dir / "spec.yaml", "job: {name: ports}\ncluster: {nodes: 2, procs_per_node: 1}\nparallel: {dp: 2}\n");
  const std::string port = std::to_string(free_port());
  std::vector<std::string> env = {tag.env(), "DTRAIN_TOKEN=ports"};
  Child first({dtrain::testing::dtrain_bin(), "rendezvous", dir / "spec.yaml", "--port", port},
              dir / "first.out", env);
  REQUIRE_MESSAGE(wait_until([&] { return has(first.output(), "listening"); }, 20), first.output());
  Child second({dtrain::testing::dtrain_bin(), "rendezvous", dir / "spec.yaml", "--port", port},
               dir / "second.out", env);
  REQUIRE_MESSAGE(second.wait(10), second.output());
  CHECK(second.exit_code() != 0);
  CHECK_MESSAGE(has(second.output(), "port " + port + " is in use (by pid " + std::to_string(first.pid())),
                second.output());
  CHECK(first.running());
}

TEST_CASE("bad input: exit 2 naming the field, before any work, quickly and small") {
  TempDir dir;
  write_file(dir / "text.txt", std::string(4096, 'a'));
  write_file(dir / "spec.yaml",
             "job: {name: bad}\nmodel: {seq_len: 16}\n"
             "data: {path: " + (dir / "text.txt") + "}\nlog: {dir: " + (dir / "run") + "}\n");
  write_file(dir / "empty.yaml", "");
  write_file(dir / "afile", "x");
  write_file(dir / "typo.yaml", "train: {stpes: 10}\n");
  fs::create_directories(dir / "adir");
  const std::string spec = dir / "spec.yaml";
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> expect;  // every part must be in the output
  };
  const std::vector<Case> cases = {
      {{"validate", dir / "adir"}, {"SPEC = " + (dir / "adir") + " is a directory"}},
      {{"launch", dir / "empty.yaml"}, {"SPEC = " + (dir / "empty.yaml") + " is empty"}},
      {{"validate", spec, "--set", "train.micro_batch=1000000000"}, {"train.micro_batch(1000000000)", "maximum"}},
      {{"launch", spec, "--set", "data.path=" + (dir / "adir")}, {"data.path = " + (dir / "adir") + " is a directory"}},
      {{"launch", spec, "--set", "data.path=" + (dir / "afile")}, {"data.path", "fewer than one sample"}},
      {{"validate", spec, "--set", "model.d_model=1000000", "--set", "model.heads=1"}, {"model.d_model = 1000000"}},
      {{"validate", spec, "--set", "model.d_model=16384", "--set", "model.heads=1", "--set", "model.layers=64"},
       {"model.d_model = 16384", "--allow-large"}},
      {{"launch", spec, "--set", "checkpoint.dir=" + (dir / "afile")}, {"checkpoint.dir = " + (dir / "afile"), "not a directory"}},
      {{"launch", spec, "--node-rank", "-3"}, {"--node-rank"}},
      {{"launch", spec, "--node-rank", "1"}, {"--node-rank 1", "cluster.nodes = 1"}},
      {{"launch", spec, "--ranks", "5"}, {"--ranks 5", "1 rank(s)"}},
      {{"bench", "comm", "--op", "foo"}, {"--op foo", "all_reduce"}},
      {{"bench", "comm", "--min", "64M", "--max", "1K"}, {"--min 64M is larger than --max 1K"}},
      {{"lanch", spec}, {"'lanch' is not a subcommand of dtrain", "did you mean launch?", "valid: "}},
      {{"ckpt", "merj"}, {"'merj' is not a subcommand of dtrain ckpt", "did you mean merge?"}},
      {{"validate", dir / "typo.yaml"}, {"train.stpes", "did you mean train.steps?"}},
  };
  // "Quickly" against this test's own yardstick: `dtrain validate` of the
  // good spec (the same start-up and parse), the slowest of three runs.
  Measured good;
  for (int i = 0; i < 3; ++i) {
    Measured g = run_measured({"validate", spec}, dir / "good.out");
    REQUIRE_MESSAGE(g.code == 0, g.output);
    good.seconds = std::max(good.seconds, g.seconds);
    good.cpu_s = std::max(good.cpu_s, g.cpu_s);
  }
  for (const auto& c : cases) {
    std::string line;
    for (const auto& a : c.args) line += a + " ";
    CAPTURE(line);
    Measured m = run_measured(c.args, dir / "case.out");
    INFO(m.output);
    CHECK(m.code == 2);
    for (const auto& e : c.expect) CHECK(has(m.output, e));
    MESSAGE(line << ": " << m.seconds << " s, " << m.cpu_s << " s CPU (validate of the good spec: "
                 << good.seconds << " s, " << good.cpu_s << " s CPU)");
    CHECK(m.cpu_s <= 10 * good.cpu_s);
    CHECK(m.max_rss_kb < 100 * 1024);
    CHECK_FALSE(fs::exists(dir / "run/rank_0.log"));  // no worker ever started
  }
}

TEST_CASE("topo stays readable at 4096 nodes x 8 GPUs; json lists everything") {
  TempDir dir;
  write_file(dir / "spec.yaml", "job: {name: big}\nmodel: {heads: 8, layers: 8}\nparallel: {tp: 8, pp: 8}\n");
  Measured text = run_measured({"topo", dir / "spec.yaml", "--nodes", "4096", "--gpus-per-node", "8",
                                "--set", "parallel.dp=512"},
                               dir / "topo.out", 120);
  CHECK_MESSAGE(text.code == 0, text.output.substr(0, 2000));
  CHECK(text.output.size() < 200 * 1024);
  CHECK(has(text.output, "ranks not shown (--format json lists every rank)"));
  CHECK(has(text.output, "more dp groups"));
  MESSAGE("topo text at 32768 ranks: " << text.output.size() << " bytes in " << text.seconds << " s");
}

TEST_CASE("bench comm: its temporary directory is gone after the run") {
  TempDir dir;
  auto before = [] {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
      if (e.path().filename().string().rfind("dtrain-bench-comm-", 0) == 0) v.push_back(e.path());
    return v;
  };
  auto existing = before();
  TagGuard tag;
  auto [code, out] = dtrain::testing::run_command(
      {dtrain::testing::dtrain_bin(), "bench", "comm", "-n", "2", "--min", "1K", "--max", "2K",
       "--iters", "1"},
      dir / "bench.out", 120, {tag.env()});
  CHECK_MESSAGE(code == 0, out);
  CHECK(before() == existing);
}
