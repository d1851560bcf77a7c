// Validation loss and `dtrain eval` through the real binary, on the tiny
// parity spec (tests/support/parity.h: fp32, global batch 8), dropout 0.1
// (training draws masks; evaluation must turn them off and draw none), with
// data.valid.path (another text), 6 steps, every 4: val_loss in metrics.jsonl at
// steps 4 and 6 (4 is not a logging step) on 1 process, dp 2 x tp 2 and
// pp 2 within 1e-5; the training losses of the 1-process run equal those of
// the same run without data.valid (steps 5 and 6 come after an evaluation). `dtrain eval --format json` of its final
// checkpoint at dp 1, dp 2 x tp 2, pp 2 and ZeRO-3 within 1e-5 of each other
// and of the run's own val_loss at step 6 (11 windows: uneven over dp, so
// filler rows must not count); negative control: the checkpoint of step 3
// misses by >= 100x the tolerance. Bad input exits 2 naming the field.
// data.valid.blend (two more texts, 0.7 / 0.3, 10 windows = 7 + 3): val_loss
// and val_loss_by_source at 1 process, dp 2 x tp 2 and pp 2 within 1e-5;
// `dtrain eval` of the blend equals the run's, and of each file alone on its
// windows equals its val_loss_by_source (controls: the figures of step 2);
// a weight <= 0 and a missing file exit 2 naming the entry.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing;
using parity::Parity;

constexpr double kTol = 1e-5;
constexpr int kWindows = 11;
// data.valid.path: a text of other word salad beside the fixture's training text.
std::vector<std::string> valid_sets() {
  auto& p = Parity::get();
  const std::string path = p.dir / "valid.txt";
  if (read_file(path).empty())
    write_file(path, word_salad(8 * 1024, {"validation ", "text ", "is ", "never ", "trained ", "on, ", "rank ",
                                           "the ", "model ", "bytes.\n"}));
  return {"train.steps=6", "log.every=5", "checkpoint.every=3", "model.dropout=0.1", "data.valid.path=" + path, "data.valid.every=4",
          "data.valid.batches=" + std::to_string(kWindows)};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// dp x tp x pp ranks at global batch 8 (pp: 2 micro-batches of 4).
std::vector<std::string> layout(int dp, int tp, int pp) {
  const int m = pp > 1 ? 2 : 1;
  return {"cluster.procs_per_node=" + std::to_string(dp * tp * pp), "parallel.dp=" + std::to_string(dp),
          "parallel.tp=" + std::to_string(tp), "parallel.pp=" + std::to_string(pp),
          "train.micro_batch=" + std::to_string(8 / (dp * m)), "train.grad_accum=" + std::to_string(m)};
}

// step -> value of `key` for every metrics.jsonl record that has it.
std::map<int, double> by_step(const std::string& path, const std::string& key) {
  std::map<int, double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key) && j[key].is_number()) out[j["step"].get<int>()] = j[key].get<double>();
  }
  return out;
}

const std::string& trained(const std::string& name, const std::vector<std::string>& sets) {
  static std::map<std::string, std::string> done;
  if (!done.count(name)) {
    auto [code, out] = parity::launch_raw(name, sets);
    INFO(out);
    REQUIRE(code == 0);
    done[name] = Parity::get().dir / name;
  }
  return done[name];
}

const std::string& reference() { return trained("ref", valid_sets()); }

// `dtrain eval --format json` of `ckpt` on the fixture's spec with `base`, then `sets`.
std::pair<int, std::string> eval_on(const std::vector<std::string>& base, const std::string& name,
                                    const std::string& ckpt, std::vector<std::string> sets,
                                    std::vector<std::string> args = {}) {
  auto& p = Parity::get();
  TagGuard tag;
  sets = with(with(base, {"log.dir=" + p.dir / name}), sets);
  sets.push_back("cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port()));
  std::vector<std::string> argv = {dtrain_bin(), "eval", p.dir / "spec.yaml", "--ckpt", ckpt, "--format", "json"};
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  argv.insert(argv.end(), args.begin(), args.end());
  // stdout alone, so the test sees exactly what a pipe would.
  argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>'" + p.dir / (name + ".stderr") + "'"});
  return run_command(argv, p.dir / (name + ".log"), 300, {tag.env(), "DTRAIN_NO_REBUILD=1"});
}

// eval_on with valid_sets().
std::pair<int, std::string> eval(const std::string& name, const std::string& ckpt, std::vector<std::string> sets,
                                 std::vector<std::string> args = {}) {
  return eval_on(valid_sets(), name, ckpt, std::move(sets), std::move(args));
}

// eval_on's JSON, which must count `windows` windows of 32 tokens.
nlohmann::json eval_json_on(const std::vector<std::string>& base, const std::string& name, const std::string& ckpt,
                            const std::vector<std::string>& sets, int windows = kWindows,
                            std::vector<std::string> args = {}) {
  auto [code, out] = eval_on(base, name, ckpt, sets, std::move(args));
  INFO(name << " stdout:\n" << out << "\nstderr:\n" << read_file(Parity::get().dir / (name + ".stderr")));
  REQUIRE(code == 0);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(out));  // the whole of stdout: one JSON object
  REQUIRE(j.is_object());
  CHECK(j["tokens"].get<long long>() == windows * 32);
  return j;
}

nlohmann::json eval_json(const std::string& name, const std::string& ckpt, const std::vector<std::string>& sets) {
  return eval_json_on(valid_sets(), name, ckpt, sets);
}

}  // namespace

TEST_CASE("data.valid: val_loss every 4 steps and at the end, the same on every layout; training unchanged") {
  const std::string ref = reference();
  const auto val = by_step(ref + "/metrics.jsonl", "val_loss");
  REQUIRE(val.size() == 2);
  CHECK(val.count(4) == 1);  // not a logging step (log.every 5): logged for its evaluation
  CHECK(val.count(6) == 1);
  CHECK(by_step(ref + "/metrics.jsonl", "eval_ms").size() == 2);
  for (const auto& [step, ppl] : by_step(ref + "/metrics.jsonl", "val_ppl"))
    CHECK(std::abs(ppl - std::exp(val.at(step))) < 1e-9 * ppl);

  // The same run without data.valid: the same training losses.
  const std::string plain = trained("plain", {"train.steps=6", "log.every=5", "checkpoint.every=3", "model.dropout=0.1"});
  const auto loss_valid = by_step(ref + "/metrics.jsonl", "loss");
  const auto loss_plain = by_step(plain + "/metrics.jsonl", "loss");
  REQUIRE(loss_plain.size() == 3);  // steps 1, 5, 6
  double worst = 0;
  for (const auto& [step, loss] : loss_plain) {
    REQUIRE(loss_valid.count(step) == 1);
    worst = std::max(worst, std::abs(loss_valid.at(step) - loss));
  }
  MESSAGE("training loss with vs without data.valid: max diff " << worst << " (required 0: the same steps)");
  CHECK(worst == 0);

  for (const auto& [name, sets] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"dp2tp2", layout(2, 2, 1)}, {"pp2", layout(1, 1, 2)}}) {
    const auto got = by_step(trained(name, with(valid_sets(), sets)) + "/metrics.jsonl", "val_loss");
    REQUIRE(got.size() == 2);
    double diff = 0;
    for (const auto& [step, v] : val) diff = std::max(diff, std::abs(got.at(step) - v));
    MESSAGE("val_loss " << name << " vs 1 process: max diff " << diff << " (tolerance " << kTol << ")");
    CHECK(diff <= kTol);
  }
  // Control: the metric follows the weights (steps 4 and 6 differ by far more).
  MESSAGE("val_loss step 4 vs step 6 (control): " << std::abs(val.at(4) - val.at(6)));
  CHECK(std::abs(val.at(4) - val.at(6)) >= 100 * kTol);
}

TEST_CASE("dtrain eval --format json: the same loss on every layout, equal to the run's val_loss") {
  const std::string ckpt = reference() + "/ckpt";
  const nlohmann::json one = eval_json("eval_dp1", ckpt, {});
  CHECK(one["step"].get<int>() == 6);
  CHECK(std::abs(one["ppl"].get<double>() - std::exp(one["loss"].get<double>())) < 1e-9 * one["ppl"].get<double>());
  const double loss = one["loss"].get<double>();
  const double val6 = by_step(reference() + "/metrics.jsonl", "val_loss").at(6);
  MESSAGE("eval dp1 " << loss << " vs the run's val_loss at step 6 " << val6 << ": diff " << std::abs(loss - val6));
  CHECK(std::abs(loss - val6) <= kTol);
  for (const auto& [name, sets] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"eval_dp2tp2", layout(2, 2, 1)},
           {"eval_pp2", layout(1, 1, 2)},
           {"eval_zero3", with(layout(2, 1, 1), {"parallel.zero=3"})}}) {
    const double got = eval_json(name, ckpt, sets)["loss"].get<double>();
    MESSAGE(name << " vs dp1: diff " << std::abs(got - loss) << " (tolerance " << kTol << ")");
    CHECK(std::abs(got - loss) <= kTol);
  }
  // Negative control: another checkpoint (step 3) of the same run.
  const nlohmann::json three = eval_json("eval_step3", ckpt + "/step_3", {});
  CHECK(three["step"].get<int>() == 3);
  const double miss = std::abs(three["loss"].get<double>() - loss);
  MESSAGE("control: step 3 vs step 6: diff " << miss << " (must be >= " << 100 * kTol << ")");
  CHECK(miss >= 100 * kTol);
}

TEST_CASE("dtrain eval: bad input exits 2 naming it, before any worker") {
  const std::string ckpt = reference() + "/ckpt";
  auto& p = Parity::get();
  const auto err = [&](const std::string& name) { return read_file(p.dir / (name + ".stderr")); };
  auto [c1, o1] = eval("bad_missing", p.dir / "no_such_ckpt", {});
  CHECK(c1 == 2);
  CHECK(err("bad_missing").find("--ckpt = " + p.dir / "no_such_ckpt") != std::string::npos);
  auto [c2, o2] = eval("bad_batches", ckpt, {}, {"--batches", "0"});
  CHECK(c2 == 2);
  CHECK(err("bad_batches").find("--batches = 0: must be >= 1") != std::string::npos);
  auto [c3, o3] = eval("bad_shape", ckpt, {"model.d_model=64"});
  CHECK(c3 == 2);
  CHECK(err("bad_shape").find("model.d_model = 32 in the checkpoint, 64 in the spec") != std::string::npos);
  auto [c4, o4] = eval("bad_every", ckpt, {"data.valid.every=0"});
  CHECK(c4 == 2);
  CHECK(err("bad_every").find("data.valid.every = 0: must be >= 1") != std::string::npos);
  auto [c5, o5] = eval("bad_path", ckpt, {"data.valid.path=" + p.dir / "no_such.txt"});
  CHECK(c5 == 2);
  CHECK(err("bad_path").find("data.valid.path = " + p.dir / "no_such.txt") != std::string::npos);
  for (const char* name : {"bad_missing", "bad_batches", "bad_shape", "bad_every", "bad_path"}) {
    INFO(name << ": " << err(name));
    CHECK(err(name).find("rank 0") == std::string::npos);  // no worker started
    CHECK(read_file(p.dir / (std::string(name) + ".log")).empty());  // nothing on stdout
  }
}

namespace {

// data.valid.blend: two other texts, weights 0.7 and 0.3, 10 windows: by
// data.blend's rule 7 come from va.txt (its windows 0-6) and 3 from vb.txt
// (0-2). 4 steps, evaluated after steps 2 and 4, a checkpoint at each.
constexpr int kBlendWindows = 10;
std::string blend_file(const std::string& name, std::vector<std::string> words) {
  const std::string path = Parity::get().dir / name;
  if (read_file(path).empty()) write_file(path, word_salad(2 * 1024, std::move(words)));
  return path;
}
std::string va() { return blend_file("va.txt", {"another ", "text ", "to ", "validate ", "on.\n"}); }
std::string vb() { return blend_file("vb.txt", {"zebras ", "quietly ", "juggle ", "xylophones; "}); }
std::vector<std::string> blend_base() {
  return {"train.steps=4", "log.every=5", "checkpoint.every=2", "data.valid.every=2",
          "data.valid.batches=" + std::to_string(kBlendWindows)};
}
std::vector<std::string> blend_sets() {
  return with(blend_base(), {"data.valid.blend=[{path: " + va() + ", weight: 0.7}, {path: " + vb() + ", weight: 0.3}]"});
}

// step -> val_loss_by_source of every metrics.jsonl record that has it.
std::map<int, std::map<std::string, double>> by_source(const std::string& path) {
  std::map<int, std::map<std::string, double>> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("val_loss_by_source")) continue;
    for (const auto& [name, v] : j["val_loss_by_source"].items()) out[j["step"].get<int>()][name] = v.get<double>();
  }
  return out;
}

}  // namespace

TEST_CASE("data.valid.blend: val_loss and val_loss_by_source the same on every layout, equal to dtrain eval") {
  const std::string ref = trained("blend_dp1", blend_sets());
  const auto val = by_step(ref + "/metrics.jsonl", "val_loss");
  const auto src = by_source(ref + "/metrics.jsonl");
  REQUIRE(val.size() == 2);
  REQUIRE(src.size() == 2);
  for (const auto& [step, losses] : src) {
    REQUIRE(losses.size() == 2);
    REQUIRE(losses.count("va.txt") == 1);
    REQUIRE(losses.count("vb.txt") == 1);
    // The blend's loss is the mean over all 10 windows: 7 of va.txt, 3 of vb.txt.
    const double mean = (7 * losses.at("va.txt") + 3 * losses.at("vb.txt")) / 10;
    MESSAGE("step " << step << ": val_loss " << val.at(step) << ", va.txt " << losses.at("va.txt") << ", vb.txt "
                    << losses.at("vb.txt") << ", (7 va + 3 vb) / 10 differs by " << std::abs(mean - val.at(step)));
    CHECK(std::abs(mean - val.at(step)) <= 1e-12);
  }
  // Another layout: the same windows, the same figures.
  for (const auto& [name, sets] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"blend_dp2tp2", layout(2, 2, 1)}, {"blend_pp2", layout(1, 1, 2)}}) {
    const std::string run = trained(name, with(blend_sets(), sets));
    const auto got = by_step(run + "/metrics.jsonl", "val_loss");
    const auto got_src = by_source(run + "/metrics.jsonl");
    REQUIRE(got.size() == 2);
    REQUIRE(got_src.size() == 2);
    double diff = 0;
    for (const auto& [step, v] : val) {
      diff = std::max(diff, std::abs(got.at(step) - v));
      for (const auto& [file, loss] : src.at(step)) diff = std::max(diff, std::abs(got_src.at(step).at(file) - loss));
    }
    MESSAGE("val_loss and val_loss_by_source " << name << " vs 1 process: max diff " << diff << " (tolerance " << kTol
                                               << ")");
    CHECK(diff <= kTol);
  }

  // `dtrain eval` of the last checkpoint: the blend, then each file alone on its windows.
  const std::string ckpt = ref + "/ckpt";
  const nlohmann::json all = eval_json_on(blend_sets(), "blend_eval", ckpt, {}, kBlendWindows);
  CHECK(all["step"].get<int>() == 4);
  const double d_all = std::abs(all["loss"].get<double>() - val.at(4));
  MESSAGE("dtrain eval of the blend vs the run's val_loss at step 4: diff " << d_all << " (tolerance " << kTol << ")");
  CHECK(d_all <= kTol);
  REQUIRE(all.contains("loss_by_source"));
  double worst = 0;
  for (const auto& [file, path, windows] : std::vector<std::tuple<std::string, std::string, int>>{
           {"va.txt", va(), 7}, {"vb.txt", vb(), 3}}) {
    worst = std::max(worst, std::abs(all["loss_by_source"][file].get<double>() - src.at(4).at(file)));
    const nlohmann::json one = eval_json_on(with(blend_base(), {"data.valid.path=" + path}), "blend_eval_" + file,
                                            ckpt, {}, windows, {"--batches", std::to_string(windows)});
    const double d = std::abs(one["loss"].get<double>() - src.at(4).at(file));
    MESSAGE("dtrain eval of " << file << " alone (" << windows << " windows) vs val_loss_by_source at step 4: diff "
                              << d << " (tolerance " << kTol << ")");
    CHECK(d <= kTol);
    // Control: the same file's figure after step 2 misses by far.
    const double miss = std::abs(one["loss"].get<double>() - src.at(2).at(file));
    MESSAGE("control: " << file << " at step 2 vs step 4: diff " << miss << " (must be >= " << 100 * kTol << ")");
    CHECK(miss >= 100 * kTol);
  }
  MESSAGE("dtrain eval's loss_by_source vs the run's: max diff " << worst << " (tolerance " << kTol << ")");
  CHECK(worst <= kTol);
  const double miss = std::abs(val.at(2) - val.at(4));
  MESSAGE("control: val_loss at step 2 vs step 4: diff " << miss << " (must be >= " << 100 * kTol << ")");
  CHECK(miss >= 100 * kTol);
}

TEST_CASE("data.valid.blend: bad input exits 2 naming the entry, before any worker; dtrain validate checks files") {
  auto& p = Parity::get();
  const std::string ckpt = trained("blend_dp1", blend_sets()) + "/ckpt";
  const auto err = [&](const std::string& name) { return read_file(p.dir / (name + ".stderr")); };
  const std::string missing = p.dir / "no_such_valid.txt";
  auto [c1, o1] = eval_on(blend_base(), "blend_bad_weight", ckpt,
                          {"data.valid.blend=[{path: " + va() + ", weight: -1}, {path: " + vb() + ", weight: 1}]"});
  CHECK(c1 == 2);
  CHECK(err("blend_bad_weight").find("data.valid.blend[0].weight = -1.0 (" + va() + "): must be > 0") !=
        std::string::npos);
  auto [c2, o2] = eval_on(blend_base(), "blend_bad_file", ckpt,
                          {"data.valid.blend=[{path: " + va() + ", weight: 1}, {path: " + missing + ", weight: 1}]"});
  CHECK(c2 == 2);
  CHECK(err("blend_bad_file").find("data.valid.blend[1].path = " + missing) != std::string::npos);
  for (const char* name : {"blend_bad_weight", "blend_bad_file"}) {
    INFO(name << ": " << err(name));
    CHECK(err(name).find("rank 0") == std::string::npos);  // no worker started
    CHECK(read_file(p.dir / (std::string(name) + ".log")).empty());  // nothing on stdout
  }
  // `dtrain validate` opens the files too (data.format bytes here).
  std::vector<std::string> argv = {dtrain_bin(), "validate", p.dir / "spec.yaml", "--set",
                                   "data.valid.blend=[{path: " + missing + ", weight: 1}]"};
  auto [c3, o3] = run_command(argv, p.dir / "blend_validate.log", 60, {"DTRAIN_NO_REBUILD=1"});
  INFO(o3);
  CHECK(c3 == 2);
  CHECK(o3.find("data.valid.blend[0].path = " + missing) != std::string::npos);
}
