// Checkpoints end to end with the real `dtrain` (docs/ARCHITECTURE.md, 'What
// counts as working'): bit-exact resume after SIGKILL of a worker (agent
// restart, and `dtrain resume`) and after SIGTERM preemption, a crash in the
// middle of a save, resharding dp=4 -> dp=2 / dp=1 within 1e-5 (negative
// control: the dp=2 resume with fault.kind reset_moments_on_load misses by >=
// 100x), merge vs the 1-process model plus a Python reader of the public format,
// `ckpt inspect` and `ckpt merge --with-optimizer`, and bad checkpoints. A run's
// final parameters are those of its last checkpoint, through `dtrain ckpt
// merge`. checkpoint.async is checkpoint_async_test.cpp; the fixture is
// tests/support/checkpoint_run.h. Every run from step 1 must have trained (its
// loss fell): equal curves of frozen models prove nothing. Tiny model: a run takes seconds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/checkpoint_run.h"

namespace {

using namespace dtrain::testing::ckpt_run;
using dtrain::testing::read_latest;
using dtrain::testing::read_safetensors_f32;

// `ckpt merge --with-optimizer` of a DDP checkpoint (its rank files hold
// every full model and AdamW tensor once, the dp replicas splitting them by
// bytes): the merged file holds each of them,
// renamed, with the same bytes, and its model part is `params`, the plain
// merge (without the flag) of the same checkpoint, which holds the model only.
void check_merge_with_optimizer(const TempDir& dir, const std::string& step_dir,
                                const std::map<std::string, std::vector<float>>& params) {
  const std::string merged = dir / "merged_opt.safetensors";
  auto [code, output] = dtrain::testing::run_command(
      {dtrain::testing::dtrain_bin(), "ckpt", "merge", step_dir, merged, "--with-optimizer"},
      merged + ".log", 60);
  INFO(output);
  REQUIRE(code == 0);
  std::map<std::string, std::vector<float>> shard;  // every rank file's tensors
  for (const auto& e : fs::directory_iterator(step_dir))
    if (e.path().extension() == ".safetensors")
      for (auto& [name, v] : read_safetensors_f32(e.path().string())) shard[name] = std::move(v);
  const auto m = read_safetensors_f32(merged);
  REQUIRE(!params.empty());
  CHECK(m.size() == 3 * params.size());
  size_t nonzero = 0, differing = 0;
  for (const auto& [name, v] : params) {
    CAPTURE(name);
    REQUIRE(m.count(name));
    REQUIRE(shard.count("model/" + name));
    CHECK(std::memcmp(m.at(name).data(), v.data(), v.size() * 4) == 0);
    CHECK(std::memcmp(shard.at("model/" + name).data(), v.data(), v.size() * 4) == 0);
    for (const std::string moment : {"exp_avg", "exp_avg_sq"}) {
      const std::string merged_name = "optim." + moment + "." + name;
      const std::string shard_name = "optim/" + moment + "/" + name;
      REQUIRE(m.count(merged_name));
      REQUIRE(shard.count(shard_name));
      REQUIRE(m.at(merged_name).size() == v.size());
      if (std::memcmp(m.at(merged_name).data(), shard.at(shard_name).data(), v.size() * 4) != 0) ++differing;
      for (float x : m.at(merged_name)) nonzero += x != 0;
    }
  }
  CHECK_MESSAGE(differing == 0, differing << " optimizer tensors differ between the merged file and the shard");
  CHECK(nonzero > 0);  // AdamW steps left non-zero moments
}

}  // namespace

TEST_CASE("bit-exact resume after SIGKILL of a worker: agent restart and dtrain resume") {
  Fixture f;
  Run ref = f.run("ref", {});
  INFO(ref.output);
  REQUIRE(ref.code == 0);
  REQUIRE(ref.losses.size() == size_t(kSteps));
  check_trained("uninterrupted", ref);
  auto ref_p = f.params("ref");

  // Rank 0 SIGKILLs itself after step 23; the agent restarts the workers,
  // which load step_20 and redo 21..30. The restart appends to the same
  // metrics file: a restart that loaded nothing would log 1..30 again (and,
  // being deterministic, still end bit-exact).
  Run restarted = f.run("restart", {"cluster.max_restarts=1", "fault.kind=kill_after_step", "fault.step=23"});
  INFO(restarted.output);
  REQUIRE(restarted.code == 0);
  CHECK(restarted.output.find("resuming from step 20") != std::string::npos);
  CHECK(step_list(restarted.steps) == step_list(concat(steps_from(1, 23), steps_from(21, kSteps))));
  check_bit_exact(ref, restarted, ref_p, f.params("restart"), 21);

  // Killed after step 20 with no restarts left: the job fails; `dtrain resume`
  // continues, appending 21..30 to the killed run's records (a resume that
  // loaded nothing would start the file over).
  Run killed = f.run("killed", {"fault.kind=kill_after_step", "fault.step=20"});
  INFO(killed.output);
  REQUIRE(killed.code != 0);
  REQUIRE(read_latest(f.dir / "killed/ckpt") == "step_20");
  CHECK(step_list(killed.steps) == step_list(steps_from(1, 20)));
  const std::string killed_records = dtrain::testing::read_file(f.dir / "killed/metrics.jsonl");
  Run resumed = f.run("killed", {}, {}, f.dir / "killed/ckpt", /*keep_ckpt_dir=*/true);
  INFO(resumed.output);
  REQUIRE(resumed.code == 0);
  CHECK(resumed.output.find("resuming from step 20") != std::string::npos);
  CHECK(dtrain::testing::read_file(f.dir / "killed/metrics.jsonl").rfind(killed_records, 0) == 0);
  CHECK(step_list(resumed.steps) == step_list(steps_from(1, kSteps)));
  check_bit_exact(ref, resumed, ref_p, f.params("killed"), 21);
}

TEST_CASE("crash in the middle of a save: latest stays on the previous checkpoint") {
  Fixture f;
  Run crashed = f.run("crash", {"fault.kind=crash_during_save", "fault.rank=1", "fault.step=20"});
  INFO(crashed.output);
  REQUIRE(crashed.code != 0);
  check_trained("crashed at the save of step 20", crashed, 20);
  const std::string root = f.dir / "crash/ckpt";
  CHECK(read_latest(root) == "step_10");
  CHECK(fs::exists(root + "/step_20.tmp"));
  CHECK(!fs::exists(root + "/step_20"));
  CHECK(fs::exists(root + "/step_20.tmp/rank_1.safetensors"));  // the half-written shard
  // The previous checkpoint verifies and loads; the .tmp is cleaned.
  auto [code, out] = dtrain::testing::run_command({dtrain::testing::dtrain_bin(), "ckpt", "inspect", root},
                                                  f.dir / "inspect.log", 60);
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("step 10 |") != std::string::npos);
  CHECK(out.find(": OK") != std::string::npos);
  Run again = f.run("crash", {});
  INFO(again.output);
  REQUIRE(again.code == 0);
  CHECK(again.output.find("resuming from step 10") != std::string::npos);
  CHECK(again.output.find("removed 1 unfinished .tmp") != std::string::npos);
  CHECK(!fs::exists(root + "/step_20.tmp"));
  CHECK(read_latest(root) == "step_30");
  // The relaunch trained 11..30 only, after the crashed run's 1..20.
  CHECK(step_list(again.steps) == step_list(concat(steps_from(1, 20), steps_from(11, kSteps))));
  check_trained("crashed + relaunched", again);
}

TEST_CASE("SIGTERM: workers finish the step, checkpoint, exit; dtrain resume continues bit-exactly") {
  Fixture f;
  // A step takes milliseconds: 100 of them leave the signal ample time to
  // land before the end (it stops 2-3 steps after the signal).
  const int steps = 100;
  const std::string train_steps = "train.steps=" + std::to_string(steps), every = "checkpoint.every=50";
  Run ref = f.run("ref", {train_steps, every});
  INFO(ref.output);
  REQUIRE(ref.code == 0);
  check_trained("uninterrupted", ref, steps);
  auto ref_p = f.params("ref");

  // The same spec (train.steps included, so the same lr schedule), SIGTERM
  // to dtrain once step 12 is logged, long before the end.
  dtrain::testing::TagGuard tag;
  const std::string run_dir = f.dir / "term";
  std::vector<std::string> argv = {dtrain::testing::dtrain_bin(), "launch", f.dir / "spec.yaml"};
  for (std::string s : {"log.dir=" + run_dir, "checkpoint.dir=" + run_dir + "/ckpt", train_steps, every,
                        std::string("cluster.grace_s=60"),
                        "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())})
    argv.insert(argv.end(), {"--set", s});
  dtrain::testing::Child child(argv, f.dir / "term.log", {tag.env(), "DTRAIN_NO_REBUILD=1"});
  for (int i = 0; i < 6000 && child.running() && !read_metrics(run_dir + "/metrics.jsonl").losses.count(12); ++i) {
    child.wait(0.01);
  }
  INFO(child.output());
  REQUIRE(read_metrics(run_dir + "/metrics.jsonl").losses.count(12));
  child.signal(SIGTERM);
  REQUIRE(child.wait(60));
  const std::string out = child.output();
  INFO(out);
  // dtrain reports the signal it got (launch.h); each worker ended by
  // itself, exit code 0, long before the 60 s grace would SIGKILL it.
  CHECK(child.exit_code() == 128 + SIGTERM);
  CHECK(out.find("saved on SIGTERM") != std::string::npos);
  CHECK(out.find("preempted: stopping after step") != std::string::npos);
  std::vector<std::string> stopped;  // the agent's line per stopped worker
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.find(" stopped: ") != std::string::npos) stopped.push_back(line.substr(line.find("rank ")));
  REQUIRE(stopped.size() == 2);
  std::sort(stopped.begin(), stopped.end());
  for (int rank : {0, 1}) {
    const std::string& line = stopped[size_t(rank)];
    CHECK(line.rfind("rank " + std::to_string(rank) + " (local rank " + std::to_string(rank), 0) == 0);
    CHECK(line.substr(line.find(" stopped: ")) == " stopped: exit code 0");  // not "signal 9 (SIGKILL)"
  }
  const std::string latest = read_latest(run_dir + "/ckpt");
  const int step = std::atoi(latest.c_str() + 5);
  MESSAGE("SIGTERM after step 12 was logged: stopped and saved after step " << step);
  REQUIRE(step > 12);
  REQUIRE(step < steps);  // else the run ended before the signal: nothing was tested
  CHECK(step_list(read_metrics(run_dir + "/metrics.jsonl").steps) == step_list(steps_from(1, step)));

  // Resume with the same train.steps: steps step+1.. appended, and the whole
  // curve and the final parameters are those of the uninterrupted run.
  Run resumed = f.run("term", {train_steps, every}, {}, run_dir + "/ckpt", /*keep_ckpt_dir=*/true);
  INFO(resumed.output);
  REQUIRE(resumed.code == 0);
  CHECK(resumed.output.find("resuming from step " + std::to_string(step)) != std::string::npos);
  CHECK(read_latest(run_dir + "/ckpt") == "step_" + std::to_string(steps));
  CHECK(step_list(resumed.steps) == step_list(steps_from(1, steps)));
  check_bit_exact(ref, resumed, ref_p, f.params("term"), 1, steps);
}

TEST_CASE("resharding dp=4 -> dp=2 and dp=1; merge vs the 1-process model; Python reader; merge --with-optimizer") {
  Fixture f;
  // Same global batch (8) in every layout, dropout 0 (docs/ARCHITECTURE.md, 'The parity recipe').
  const std::vector<std::string> dp4 = {"parallel.dp=4", "cluster.procs_per_node=4", "train.micro_batch=2",
                                        "model.dropout=0.0"};
  Run ref = f.run("dp4", dp4);
  INFO(ref.output);
  REQUIRE(ref.code == 0);
  check_trained("dp=4", ref);
  const std::string step20 = f.dir / "dp4/ckpt/step_20";
  // `name`: step_20 resumed at `dp` (a copy of it: the run writes its checkpoints beside it); returns
  // the largest relative loss difference from the dp=4 run over steps 21-30.
  const auto resumed = [&](const std::string& name, int dp, std::vector<std::string> more) {
    fs::create_directories(f.dir / (name + "_ckpt"));
    fs::copy(step20, f.dir / (name + "_ckpt/step_20"), fs::copy_options::recursive);
    more.insert(more.end(), {"parallel.dp=" + std::to_string(dp), "cluster.procs_per_node=" + std::to_string(dp),
                             "train.micro_batch=" + std::to_string(8 / dp)});
    Run r = f.run(name, more, {}, f.dir / (name + "_ckpt/step_20"), true);
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK(r.output.find("resuming from step 20") != std::string::npos);
    double worst = 0;
    for (int s = 21; s <= kSteps; ++s) {
      REQUIRE(r.losses.count(s));
      worst = std::max(worst, std::fabs(r.losses.at(s) - ref.losses.at(s)) / std::fabs(ref.losses.at(s)));
    }
    INFO("dp=4 run:\n" << seq(ref.losses, 21, kSteps) << name << " run:\n" << seq(r.losses, 21, kSteps));
    return worst;
  };
  for (int dp : {2, 1}) {
    const double worst = resumed("dp" + std::to_string(dp) + "_from_dp4", dp, {});
    MESSAGE("dp=4 -> dp=" << dp << ": max relative loss difference over steps 21-30 = " << worst
                          << " (tolerance " << kReshardRelTol << ")");
    CHECK(worst <= kReshardRelTol);
  }
  // The negative control: the resume at dp=2 with AdamW's moments zeroed on load.
  const double control = resumed("dp2_from_dp4_reset", 2, {"fault.kind=reset_moments_on_load"});
  MESSAGE("dp=4 -> dp=2 with fault.kind reset_moments_on_load (negative control): max relative loss difference "
          << control << ", miss factor " << control / kReshardRelTol << " (must be >= 100)");
  CHECK(control >= 100 * kReshardRelTol);

  // Merge the dp=4 run's final checkpoint; compare with a 1-process run.
  Run one = f.run("one", {"parallel.dp=1", "cluster.procs_per_node=1", "train.micro_batch=8", "model.dropout=0.0"});
  INFO(one.output);
  REQUIRE(one.code == 0);
  check_trained("1 process", one);
  REQUIRE(read_latest(f.dir / "dp4/ckpt") == "step_30");
  const std::string merged = f.dir / "merged.safetensors";
  auto [mcode, mout] = dtrain::testing::run_command(
      {dtrain::testing::dtrain_bin(), "ckpt", "merge", f.dir / "dp4/ckpt", merged}, f.dir / "merge.log", 60);
  INFO(mout);
  REQUIRE(mcode == 0);
  auto m = read_safetensors_f32(merged);
  auto p = f.params("one");
  REQUIRE(m.size() == p.size());
  double worst = 0;
  for (auto& [name, v] : p) {
    REQUIRE_MESSAGE(m.count(name), name << " missing from the merged file");
    REQUIRE(m.at(name).size() == v.size());
    for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, double(std::fabs(m.at(name)[i] - v[i])));
  }
  MESSAGE("merged dp=4 vs 1-process parameters: max abs difference " << worst << " (tolerance " << kParamAbsTol << ")");
  CHECK(worst <= kParamAbsTol);
  check_merge_with_optimizer(f.dir, f.dir / "dp4/ckpt/step_30", m);  // m: the plain merge of step_30

  // Python reads the merged file by the public format and computes the loss
  // over a file of exactly one global batch (8 windows); dtrain computes the
  // same as the loss of step 31 resumed from that checkpoint.
  const int T = 32;
  dtrain::testing::write_file(f.dir / "batch.txt", make_text(size_t(8 * T + 1)));
  Run eval = f.run("eval", {"train.steps=31", "data.path=" + (f.dir / "batch.txt"), "parallel.dp=1",
                            "cluster.procs_per_node=1", "train.micro_batch=8"},
                   {}, f.dir / "dp4/ckpt/step_30", false);
  INFO(eval.output);
  REQUIRE(eval.code == 0);
  REQUIRE(eval.losses.count(31));
  const std::string python = dtrain::testing::python();
  REQUIRE_MESSAGE(!python.empty(), "no Python with torch was found at configure time: run scripts/install-deps");
  auto [pcode, pout] = dtrain::testing::run_command(
      {python, dtrain::testing::source_dir() + "/tests/support/read_safetensors.py", merged,
       f.dir / "batch.txt"},
      f.dir / "python.log", 120);
  INFO(pout);
  REQUIRE(pcode == 0);
  const double py = std::strtod(pout.c_str() + pout.find("loss ") + 5, nullptr);
  const double rel = std::fabs(py - eval.losses.at(31)) / eval.losses.at(31);
  MESSAGE("Python loss " << py << " vs dtrain " << eval.losses.at(31) << ": relative difference " << rel);
  CHECK(rel <= 1e-5);
}

TEST_CASE("bad checkpoints refuse to load and fail `ckpt inspect`, naming the file, the tensor and what differs") {
  Fixture f;
  Run ok = f.run("good", {"train.steps=10"});
  INFO(ok.output);
  REQUIRE(ok.code == 0);
  check_trained("10 steps", ok, 10);
  const std::string good = f.dir / "good/ckpt/step_10";
  struct Case {
    std::string name;
    std::function<void(const std::string& dir)> damage;
    std::vector<std::string> sets;
    std::vector<std::string> expect;
    std::string inspect_expect;  // what `ckpt inspect` of the damaged dir says ("" = it passes)
  };
  const std::vector<Case> cases = {
      {"flipped byte",
       [](const std::string& d) {
         std::fstream io(d + "/rank_0.safetensors", std::ios::in | std::ios::out | std::ios::binary);
         io.seekg(-100, std::ios::end);
         char c = 0;
         io.get(c);
         io.seekp(-100, std::ios::end);
         io.put(char(c ^ 1));
       },
       {},
       {"rank_0.safetensors: tensor", "checksum mismatch"},
       "checksum mismatch"},
      {"truncated shard",
       [](const std::string& d) {
         fs::resize_file(d + "/rank_0.safetensors", fs::file_size(d + "/rank_0.safetensors") / 2);
       },
       {},
       {"rank_0.safetensors: truncated: tensor"},
       "rank_0.safetensors: truncated"},
      {"missing rank file", [](const std::string& d) { fs::remove(d + "/rank_1.safetensors"); }, {},
       {"rank_1.safetensors is missing (the index lists it as holding"},
       "rank_1.safetensors"},
      {"another model", [](const std::string&) {}, {"model.d_model=64"},
       {"does not match this run's model", "d_model=32", "tensor model/wte.weight is F32 [256, 32] in the "
                                                          "checkpoint but F32 [256, 64] in the model"},
       ""},
  };
  int i = 0;
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const std::string copy = f.dir / ("bad" + std::to_string(i++));
    fs::create_directories(copy);
    fs::copy(good, copy + "/step_10", fs::copy_options::recursive);
    dtrain::testing::write_file(copy + "/latest", "step_10\n");
    c.damage(copy + "/step_10");
    const auto before = dtrain::testing::read_file(copy + "/step_10/index.json");
    // `dtrain launch` of a spec whose checkpoint.dir holds it: resumes, so refuses.
    std::vector<std::string> sets = {"checkpoint.dir=" + copy};
    sets.insert(sets.end(), c.sets.begin(), c.sets.end());
    Run r = f.run("bad_run" + std::to_string(i), sets, {}, "", /*keep_ckpt_dir=*/true);
    INFO(r.output);
    CHECK(r.code != 0);
    for (const auto& e : c.expect) CHECK(r.output.find(e) != std::string::npos);
    CHECK(read_latest(copy) == "step_10");  // nothing overwritten
    CHECK(dtrain::testing::read_file(copy + "/step_10/index.json") == before);
    auto [icode, iout] = dtrain::testing::run_command(
        {dtrain::testing::dtrain_bin(), "ckpt", "inspect", copy}, copy + ".inspect.log", 60);
    INFO(iout);
    if (c.inspect_expect.empty()) {
      CHECK(icode == 0);
    } else {
      CHECK(icode != 0);
      CHECK(iout.find(c.inspect_expect) != std::string::npos);
      CHECK(iout.find(": OK") == std::string::npos);
    }
  }
}
