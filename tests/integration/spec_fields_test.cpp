// Spec fields that change training, each checked through an effect of the real
// `dtrain launch` that would be absent were the field ignored: train.min_lr,
// train.weight_decay, train.grad_clip, model.moe.every 2, model.moe.balance
// bias, data.format tokens-u16 and synthetic. Four tiny 1-process runs: the
// run with every field set, the same with weight_decay 0, with grad_clip 0,
// and one on synthetic data. Parsing every field is spec_fields_test's job.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/checkpoint_reader.h"
#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing;
using parity::read_metric;

constexpr int kSteps = 8;
constexpr int kVocab = 512;
// The token file holds only these ids, all above 255: read as bytes it would
// hold others (the low and high bytes).
constexpr int kFirstToken = 300, kTokenCount = 64;
constexpr double kMinLr = 3.0e-4, kWeightDecay = 0.5, kGradClip = 0.05;

// Sixteen "words" of four tokens each, together every id of
// [kFirstToken, kFirstToken + kTokenCount) once, drawn by xorshift: a
// learnable little-endian uint16 stream that holds every one of those ids.
std::string token_file_bytes(size_t tokens) {
  std::string out;
  uint64_t x = 88172645463325252ULL;
  while (out.size() < 2 * tokens) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const int w = int(x % 16);
    for (int k = 0; k < 4; ++k) {
      const int t = kFirstToken + (4 * w + k) * 37 % kTokenCount;  // 37 is prime to 64: a permutation
      out += {char(t & 0xff), char(t >> 8)};
    }
  }
  out.resize(2 * tokens);
  return out;
}

struct Run {
  std::vector<double> losses, lrs, grad_norms;
  std::string ckpt;  // the step dir saved after the last step ("" for none)
};

struct Fixture {
  static Fixture& get() {
    static Fixture f;
    return f;
  }
  TempDir dir;
  std::map<std::string, Run> runs;

  Fixture() {
    write_file(dir / "tokens.u16", token_file_bytes(16 * 1024));
    write_file(dir / "spec.yaml",
               "job: {name: spec-fields, seed: 1234}\n"
               "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
               "model: {vocab: " + std::to_string(kVocab) + ", layers: 3, d_model: 32, heads: 2, seq_len: 32, "
               "dropout: 0.0, moe: {experts: 4, top_k: 1, every: 2, balance: bias}}\n"
               "train: {steps: " + std::to_string(kSteps) + ", micro_batch: 8, lr: 3.0e-3, min_lr: " +
               std::to_string(kMinLr) + ", warmup_steps: 2, weight_decay: " + std::to_string(kWeightDecay) +
               ", grad_clip: " + std::to_string(kGradClip) + "}\n"
               "data: {path: " + (dir / "tokens.u16") + ", format: tokens-u16}\n"
               "log: {every: 1}\n");
  }

  // `dtrain launch` of the spec with `sets`, cached by name and sets (a name
  // asked for with other sets is a bug here): run dir <dir>/<name>, its
  // checkpoint (after the last step) in <name>/ckpt.
  const Run& run(const std::string& name, std::vector<std::string> sets) {
    std::string key = name + " |";
    for (const auto& s : sets) key += " --set " + s;
    if (runs.count(key)) return runs.at(key);
    for (const auto& kv : runs)
      REQUIRE_MESSAGE(kv.first.rfind(name + " |", 0) != 0, "run " << name << " asked for with other sets");
    TagGuard tag;
    const std::string run_dir = dir / name;
    sets.insert(sets.begin(), {"log.dir=" + run_dir, "checkpoint.dir=" + run_dir + "/ckpt"});
    sets.push_back("cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port()));
    std::vector<std::string> argv = {dtrain_bin(), "launch", dir / "spec.yaml"};
    for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
    auto [code, output] = run_command(argv, dir / (name + ".log"), 300, {tag.env(), "DTRAIN_NO_REBUILD=1"});
    INFO("run " << name << " output:\n" << output);
    REQUIRE(code == 0);
    Run r;
    r.losses = read_metric(run_dir + "/metrics.jsonl", "loss");
    r.lrs = read_metric(run_dir + "/metrics.jsonl", "lr");
    r.grad_norms = read_metric(run_dir + "/metrics.jsonl", "grad_norm");
    REQUIRE(r.losses.size() == size_t(kSteps));
    REQUIRE(r.lrs.size() == size_t(kSteps));
    const std::string latest = read_latest(run_dir + "/ckpt");
    if (!latest.empty()) r.ckpt = run_dir + "/ckpt/" + latest;
    return runs[key] = r;
  }
  const Run& all_fields() { return run("fields", {}); }
};

// Tensor `name` of a checkpoint as floats (F32 only).
std::vector<float> tensor(const std::string& ckpt, const std::string& name) {
  REQUIRE_MESSAGE(!ckpt.empty(), "the run saved no checkpoint after its last step");
  dtrain::checkpoint::CheckpointReader reader(ckpt);
  REQUIRE_MESSAGE(reader.at(name).dtype == "F32", name);
  std::vector<uint8_t> bytes = reader.read_full(name);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

std::set<std::string> tensor_names(const std::string& ckpt) {
  std::set<std::string> out;
  const dtrain::checkpoint::CheckpointReader reader(ckpt);
  for (const auto& t : reader.index().tensors) out.insert(t.name);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

}  // namespace

TEST_CASE("spec fields in training: min_lr ends the schedule, tokens-u16 trains, MoE in blocks 0 and 2 only") {
  const Run& r = Fixture::get().all_fields();
  MESSAGE("lr " << r.lrs.front() << " -> " << r.lrs.back() << " (min_lr " << kMinLr << "), loss "
                << r.losses.front() << " -> " << r.losses.back());
  // The cosine reaches min_lr exactly at the last step (default min_lr 0).
  CHECK(std::fabs(r.lrs.back() - kMinLr) <= 1e-12 * kMinLr);
  CHECK(r.losses.back() < r.losses.front() - 0.1);
  REQUIRE(!r.ckpt.empty());
  const std::set<std::string> names = tensor_names(r.ckpt);
  for (int block : {0, 1, 2}) {
    const std::string b = "blocks." + std::to_string(block);
    const bool moe = block % 2 == 0;  // every 2: blocks 0, 2 (every 1: all three)
    INFO("block " << block << std::string(moe ? " must be MoE" : " must be dense"));
    CHECK(names.count("model/" + b + ".moe.router.weight") == size_t(moe));
    CHECK(names.count("model/" + b + ".mlp.fc.weight") == size_t(!moe));
    CHECK(names.count("moe/selection_bias/" + b) == size_t(moe));
  }
}

TEST_CASE("spec fields in training: balance bias moves the selection bias") {
  const Run& r = Fixture::get().all_fields();
  REQUIRE(!r.ckpt.empty());
  for (const char* name : {"moe/selection_bias/blocks.0", "moe/selection_bias/blocks.2"}) {
    const std::vector<float> bias = tensor(r.ckpt, name);
    double largest = 0;
    for (float v : bias) largest = std::max(largest, double(std::fabs(v)));
    MESSAGE(std::string(name) << ": max |bias| " << largest << " after " << kSteps << " steps (balance aux keeps it 0)");
    CHECK(largest > 0.0);
  }
}

TEST_CASE("spec fields in training: weight_decay scales the rows of absent tokens by prod(1 - lr * wd)") {
  // A token that is never an input gets no gradient, so its embedding row
  // moves by the decoupled decay alone: p * prod over steps of (1 - lr_t * wd),
  // and stays p with weight_decay 0. The tokens of the file do train.
  auto& f = Fixture::get();
  const Run& with = f.all_fields();
  const Run& without = f.run("no_decay", {"train.weight_decay=0"});
  double expected = 1;
  for (double lr : with.lrs) expected *= 1 - lr * kWeightDecay;
  const std::vector<float> a = tensor(with.ckpt, "model/wte.weight"), b = tensor(without.ckpt, "model/wte.weight");
  REQUIRE(a.size() == size_t(kVocab) * 32);
  // Per element |with / (without * factor) - 1|: the worst of the absent
  // rows, and per file-token row its largest, the least of those.
  double absent_worst = 0, present_least = 1e30;
  for (int row = 0; row < kVocab; ++row) {
    const bool present = row >= kFirstToken && row < kFirstToken + kTokenCount;
    double row_miss = 0;
    for (int c = 0; c < 32; ++c) {
      const double pa = a[size_t(row) * 32 + c], pb = b[size_t(row) * 32 + c];
      row_miss = std::max(row_miss, std::fabs(pa - pb * expected) / std::max(std::fabs(pb * expected), 1e-6));
    }
    if (present) present_least = std::min(present_least, row_miss);
    else absent_worst = std::max(absent_worst, row_miss);
  }
  MESSAGE("decay factor prod(1 - lr*" << kWeightDecay << ") = " << expected << "; absent-token rows: max rel miss "
                                      << absent_worst << " (tol 1e-5); the file's token rows each miss by >= "
                                      << present_least << " (they trained)");
  CHECK(absent_worst <= 1e-5);
  CHECK(1 - expected >= 100 * 1e-5);  // the decay itself is >= 100 x the tolerance
  CHECK(present_least >= 100 * 1e-5);
}

TEST_CASE("spec fields in training: grad_clip 0.05 clips every step and changes the run") {
  // AdamW is nearly invariant to a constant gradient scale, but clipping
  // scales each step by its own factor (0.05 / norm), which moves the result.
  auto& f = Fixture::get();
  const Run& clipped = f.all_fields();
  const Run& unclipped = f.run("no_clip", {"train.grad_clip=0"});
  double least_norm = 1e30;
  for (double n : clipped.grad_norms) least_norm = std::min(least_norm, n);
  double diff = 0;
  std::string where;
  for (const auto& name : tensor_names(clipped.ckpt)) {
    if (name.rfind("model/", 0) != 0) continue;
    const double d = max_abs_diff(tensor(clipped.ckpt, name), tensor(unclipped.ckpt, name));
    if (d > diff) diff = d, where = name;
  }
  MESSAGE("smallest grad norm " << least_norm << " (clip " << kGradClip << "); final params, clip " << kGradClip
                                << " vs off: max abs diff " << diff << " (" << where
                                << "; must be >= 100 x the parity tol 1e-5)");
  CHECK(least_norm > kGradClip);
  CHECK(diff >= 100 * 1e-5);
}

TEST_CASE("spec fields in training: data.format synthetic trains without a data file") {
  auto& f = Fixture::get();
  const std::string missing = f.dir / "no-such-file";
  const Run& r = f.run("synthetic", {"data.format=synthetic", "data.path=" + missing});
  MESSAGE("synthetic: loss " << r.losses.front() << " -> " << r.losses.back());
  CHECK(!std::filesystem::exists(missing));
  CHECK(r.losses.back() < r.losses.front() - 0.1);
}
