// The fixture of the checkpoint integration tests (checkpoint_test.cpp,
// checkpoint_async_test.cpp): a tiny dp=2 GPT spec over word-salad text, a
// `dtrain launch` / `dtrain resume --ckpt` run with its metrics records read
// back, and the checks they share (bit-exact curves and parameters, a run that
// trained). Not here: what any one test asserts.
#pragma once

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

#include "tests/support/child.h"
#include "tests/support/train_run.h"

namespace dtrain::testing::ckpt_run {

namespace fs = std::filesystem;
using dtrain::testing::TempDir;
using dtrain::testing::free_port;
using dtrain::testing::read_checkpoint_params;
using dtrain::testing::word_salad;


inline constexpr int kSteps = 30;
inline constexpr double kReshardRelTol = 1e-5;
inline constexpr double kParamAbsTol = 1e-5;
inline constexpr double kMinLossDrop = 0.5;  // a run from step 1 lowers its loss by at least this

inline std::string make_text(size_t bytes) {
  return word_salad(bytes, {"the ", "model ", "saves ", "a ", "sharded ", "checkpoint ", "of ",
                            "bytes ", "and ", "every ", "rank ", "resumes ", "exactly\n"});
}

// dp=2, dropout 0.1, checkpoint every 10; cases change it with --set.
inline std::string base_spec(const TempDir& dir) {
  return "job: {name: ckpt, seed: 1234}\n"
         "cluster: {nodes: 1, procs_per_node: 2, device: cpu, backend: gloo, max_restarts: 0}\n"
         "parallel: {dp: 2, ddp: {bucket_mb: 0.01, overlap: true}}\n"
         "model: {kind: gpt, vocab: 256, layers: 2, d_model: 32, heads: 2, seq_len: 32, dropout: 0.1}\n"
         "train: {steps: " + std::to_string(kSteps) +
         ", micro_batch: 4, grad_accum: 1, lr: 3.0e-3, warmup_steps: 3, precision: fp32}\n"
         "data: {path: " + (dir / "text.txt") + ", format: bytes}\n"
         "checkpoint: {dir: " + (dir / "unused") + ", every: 10, keep: 3}\n"
         "log: {dir: " + (dir / "unused") + ", every: 1}\n"
         "entrypoint: builtin\n";
}

// The metrics records of a run dir, in file order: a restarted or resumed
// run appends to the same file, so a step logged twice was trained twice.
struct Metrics {
  std::map<int, double> losses;  // step -> loss; a step logged twice keeps the last value
  std::vector<int> steps;        // every record's step, in file order
};

inline Metrics read_metrics(const std::string& path) {
  Metrics m;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto s = line.find("\"step\": "), l = line.find("\"loss\": ");
    if (s == std::string::npos || l == std::string::npos) continue;
    const int step = std::atoi(line.c_str() + s + 8);
    m.losses[step] = std::strtod(line.c_str() + l + 8, nullptr);
    m.steps.push_back(step);
  }
  return m;
}

struct Run {
  int code = -1;
  std::string output;
  std::map<int, double> losses;
  std::vector<int> steps;  // as in Metrics
};

class Fixture {
 public:
  Fixture() {
    dtrain::testing::write_file(dir / "text.txt", make_text(64 * 1024));
    dtrain::testing::write_file(dir / "spec.yaml", base_spec(dir));
  }
  TempDir dir;

  // `dtrain launch` (or `dtrain resume --ckpt`, when ckpt is given) with
  // run dir <tmp>/<name>: metrics and checkpoints there.
  Run run(const std::string& name, std::vector<std::string> sets, std::vector<std::string> env = {},
          const std::string& ckpt = "", bool keep_ckpt_dir = false) {
    dtrain::testing::TagGuard tag;
    const std::string run_dir = dir / name;
    std::vector<std::string> argv = {dtrain::testing::dtrain_bin()};
    if (ckpt.empty())
      argv.insert(argv.end(), {"launch", dir / "spec.yaml"});
    else
      argv.insert(argv.end(), {"resume", "--ckpt", ckpt});
    sets.insert(sets.begin(), "log.dir=" + run_dir);
    // A checkpoint's stored data.path is not taken by `dtrain resume`: given again.
    if (!ckpt.empty()) sets.insert(sets.begin(), "data.path=" + (dir / "text.txt"));
    if (!keep_ckpt_dir) sets.insert(sets.begin(), "checkpoint.dir=" + run_dir + "/ckpt");
    sets.push_back("cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port()));
    for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
    env.push_back(tag.env());
    env.push_back("DTRAIN_NO_REBUILD=1");
    auto [code, output] = dtrain::testing::run_command(argv, dir / (name + ".log"), 300, env);
    Run r;
    r.code = code;
    r.output = output;
    Metrics m = read_metrics(run_dir + "/metrics.jsonl");
    r.losses = std::move(m.losses);
    r.steps = std::move(m.steps);
    return r;
  }
  // The parameters of run <name>'s latest checkpoint (<tmp>/<name>/ckpt):
  // a run from step 1 saves one after its last step.
  std::map<std::string, std::vector<float>> params(const std::string& name) {
    return read_checkpoint_params(dir / name + "/ckpt", dir.path());
  }
};

inline std::string seq(const std::map<int, double>& l, int from, int to) {
  std::ostringstream out;
  out.precision(17);
  for (int s = from; s <= to; ++s) out << "  step " << s << ": " << (l.count(s) ? l.at(s) : NAN) << "\n";
  return out.str();
}

// Losses of steps from..last bitwise equal, params bitwise equal.
inline void check_bit_exact(const Run& ref, const Run& got, const std::map<std::string, std::vector<float>>& ref_p,
                     const std::map<std::string, std::vector<float>>& got_p, int from, int last = kSteps) {
  INFO("uninterrupted:\n" << seq(ref.losses, from, last) << "resumed:\n" << seq(got.losses, from, last));
  for (int s = from; s <= last; ++s) {
    REQUIRE(got.losses.count(s));
    CHECK(std::memcmp(&ref.losses.at(s), &got.losses.at(s), sizeof(double)) == 0);
  }
  REQUIRE(!ref_p.empty());
  REQUIRE(ref_p.size() == got_p.size());
  size_t differing = 0;
  for (auto& [name, v] : ref_p)
    if (!got_p.count(name) || std::memcmp(v.data(), got_p.at(name).data(), v.size() * 4) != 0) ++differing;
  CHECK_MESSAGE(differing == 0, differing << " parameter tensors differ after step " << last);
}

// A run that started at step 1 trained: the loss of its last step is below
// the first by kMinLossDrop (a no-op optimizer would still resume bit-exactly).
inline void check_trained(const std::string& what, const Run& r, int last = kSteps) {
  REQUIRE(r.losses.count(1));
  REQUIRE(r.losses.count(last));
  MESSAGE(what << ": loss " << r.losses.at(1) << " at step 1 -> " << r.losses.at(last) << " at step "
               << last << " (must fall by >= " << kMinLossDrop << ")");
  CHECK(r.losses.at(last) < r.losses.at(1) - kMinLossDrop);
}

inline std::string step_list(const std::vector<int>& steps) {
  std::string out;
  for (int s : steps) {
    if (!out.empty()) out += ' ';
    out += std::to_string(s);
  }
  return out;
}

// Steps first..last, in order.
inline std::vector<int> steps_from(int first, int last) {
  std::vector<int> v;
  for (int s = first; s <= last; ++s) v.push_back(s);
  return v;
}

inline std::vector<int> concat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace dtrain::testing::ckpt_run
