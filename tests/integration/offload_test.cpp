// train.offload.optimizer: nvme (AdamW's moments in one file per rank,
// bucketed pread/pwrite) against the same layout without it, through the
// parity harness (tests/support/parity.h): DDP and ZeRO-3 at dp 2, TP 2 and
// PP 2 within 1e-5 with max differences printed, negative control fault.kind
// offload_no_writeback; the moments' resident bytes near 0 and offload_bytes
// = 8 B per local parameter; nothing left under the path after a job, also
// after a SIGKILL and restart, and after a failed job; checkpoints with and without offload resume
// each other; a file truncated or deleted mid-run stops the job naming it
// with the previous checkpoint intact; bad input refused before any worker.
// train.offload.params: nvme (ZeRO-3's parameter shards in a file per rank
// between uses): parity at dp 2 with the same control, the shards' bytes in
// memory below two gathered units, checkpoints both ways, truncation and
// deletion named. train.offload.optimizer: host on the CPU through its test
// override (the GPU's copies, done synchronously): parity at dp 2, DDP and
// ZeRO-1, control offload_no_writeback (the master never copied back); and
// .params: host the same way at ZeRO-3 dp 2 (control: shards never copied
// back), refused on a CPU without the override.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/offload_files.h"
#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing;
using namespace dtrain::testing::parity;
namespace fs = std::filesystem;

// 2 KiB of m and v per bucket: the tiny model's ~43k parameters take ~170
// buckets (~85 a rank under ZeRO-3), so the three staging buckets are a few
// percent of the state.
const char* kBucket = "train.offload.bucket_mb=0.002";

// A fresh directory for one run's offload files.
std::string offload_dir(const std::string& name) {
  const std::string d = Parity::get().dir / ("offload_" + name);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> nvme(const std::string& dir) {
  return {"train.offload.optimizer=nvme", "train.offload.path=" + dir, kBucket};
}

std::vector<std::string> layout(int zero) {
  return with(ranks(2, 4), {"parallel.zero=" + std::to_string(zero), "checkpoint.every=10", "checkpoint.keep=5"});
}

std::vector<std::string> left_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

double last_metric(const std::string& name, const std::string& key) {
  const auto v = read_metric(Parity::get().dir / name + "/metrics.jsonl", key);
  REQUIRE(!v.empty());
  return v.back();
}

const RunResult& plain_run(int zero) {
  return Parity::get().cached("plain_z" + std::to_string(zero), layout(zero));
}

// train.offload.params: nvme, ZeRO-3 at dp 2, 4 layers: six units, so the
// shards of all of them (what a rank keeps without offload) outweigh two
// gathered ones (what a step needs at once).
std::vector<std::string> params_layout() { return with(layout(3), {"model.layers=4"}); }

std::vector<std::string> params_nvme(const std::string& dir) {
  return {"train.offload.params=nvme", "train.offload.path=" + dir};
}

// The gathering ZeRO-3 that offload runs on (on one node, shared parameters
// would hold every shard in memory without gathers: another baseline).
const RunResult& params_plain_run() {
  return Parity::get().cached("params_plain", with(params_layout(), {"parallel.fsdp.shared_params=false"}));
}

const RunResult& params_run() {
  return Parity::get().cached("params_nvme", with(params_layout(), params_nvme(offload_dir("params_nvme"))));
}

// The elements of the largest ZeRO unit (the embeddings, one block, the
// head: model/gpt.cpp's unit_of), from a run's final parameters.
int64_t largest_unit(const std::map<std::string, std::vector<float>>& params) {
  std::map<std::string, int64_t> units;
  for (const auto& [full, values] : params) {
    const std::string name = full.rfind("model/", 0) == 0 ? full.substr(6) : full;
    std::string unit = "head";
    if (name.rfind("wte.", 0) == 0 || name.rfind("wpe.", 0) == 0) unit = "embeddings";
    if (name.rfind("blocks.", 0) == 0) unit = name.substr(0, name.find('.', 7));
    units[unit] += int64_t(values.size());
  }
  int64_t most = 0;
  for (const auto& [unit, n] : units) most = std::max(most, n);
  return most;
}

const RunResult& nvme_run(int zero) {
  const std::string name = "nvme_z" + std::to_string(zero);
  return Parity::get().cached(name, with(layout(zero), nvme(offload_dir(name))));
}

}  // namespace

TEST_CASE("optimizer nvme vs none at dp 2, DDP and ZeRO-3: parity, state out of memory, nothing left behind") {
  auto& p = Parity::get();
  for (int zero : {0, 3}) {
    const std::string what = zero == 0 ? "DDP dp2" : "ZeRO-3 dp2";
    const RunResult& plain = plain_run(zero);
    const RunResult& run = nvme_run(zero);
    const std::string name = "nvme_z" + std::to_string(zero);
    CHECK(left_in(p.dir / ("offload_" + name)).empty());  // each rank removed its file
    if (zero == 0) {
      // The control: the moments never written back (each step from zeros).
      const std::string cname = "nvme_nowb_z0";
      const RunResult control =
          launch(p.dir, cname, with(with(layout(0), nvme(offload_dir(cname))), {"fault.kind=offload_no_writeback"}));
      compare(what + " optimizer nvme vs none", run, &control, plain, "moments never written back");
    } else {
      compare(what + " optimizer nvme vs none", run, nullptr, plain);
    }
    // 8 B per local parameter in the file, what the plain run holds as tensors.
    const double resident_plain = last_metric("plain_z" + std::to_string(zero), "optimizer_bytes");
    const double resident = last_metric(name, "optimizer_bytes");
    const double offloaded = last_metric(name, "offload_bytes");
    const double io_ms = last_metric(name, "offload_io_ms");
    const double update_ms = last_metric(name, "offload_update_ms");
    MESSAGE(what << ": AdamW state in memory " << resident_plain << " B without offload, " << resident
                 << " B with (three staging buckets, " << 100 * resident / resident_plain << "%); offload_bytes "
                 << offloaded << "; last step's offload_io_ms " << io_ms << ", offload_update_ms " << update_ms);
    CHECK(offloaded == resident_plain);
    CHECK(resident <= 0.05 * resident_plain);
    CHECK(io_ms > 0);
    CHECK(update_ms > 0);
    CHECK(read_metric(p.dir / "plain_z" + std::to_string(zero) + "/metrics.jsonl", "offload_bytes").empty());
    if (zero == 0) {  // DDP: every parameter is local
      const auto at = run.output.find("model gpt: ");
      REQUIRE(at != std::string::npos);
      const double params = std::atof(run.output.c_str() + at + 11);
      MESSAGE("DDP: " << params << " parameters, offload_bytes / parameter = " << offloaded / params);
      CHECK(offloaded == 8 * params);
    }
  }
}

TEST_CASE("optimizer host on a CPU (test override) vs none at dp 2, DDP and ZeRO-1: parity, state off the device") {
  // The override runs host's GPU path on the CPU: master and moments in
  // buffers of their own, gradients copied in, parameters copied out.
  const std::vector<std::string> env = {std::string(dtrain::kHostOffloadOnCpuEnv) + "=1"};
  auto& p = Parity::get();
  for (int zero : {0, 1}) {
    const std::string what = zero == 0 ? "DDP dp2" : "ZeRO-1 dp2";
    const RunResult& plain = plain_run(zero);
    const std::string name = "host_z" + std::to_string(zero);
    const RunResult run = launch(p.dir, name, with(layout(zero), {"train.offload.optimizer=host"}), env);
    if (zero == 0) {
      // The control: the updated master never copied back (the parameters never change).
      const RunResult control = launch(
          p.dir, "host_nocopy_z0", with(layout(0), {"train.offload.optimizer=host", "fault.kind=offload_no_writeback"}),
          env);
      compare(what + " optimizer host (CPU override) vs none", run, &control, plain, "parameters never copied back");
    } else {
      // ZeRO-1's all-gather writes the flat buffer the parameters are views
      // of: the master follows their version counter.
      compare(what + " optimizer host (CPU override) vs none", run, nullptr, plain);
    }
    const double resident_plain = last_metric("plain_z" + std::to_string(zero), "optimizer_bytes");
    const double resident = last_metric(name, "optimizer_bytes");
    const double offloaded = last_metric(name, "offload_bytes");
    const double io_ms = last_metric(name, "offload_io_ms"), update_ms = last_metric(name, "offload_update_ms");
    MESSAGE(what << " host: AdamW state on the device " << resident_plain << " B without offload, " << resident
                 << " B with; offload_bytes " << offloaded << " (moments + fp32 master = "
                 << 1.5 * resident_plain << " B, + gradient staging); last step's offload_io_ms " << io_ms
                 << " (the copies down and up), offload_update_ms " << update_ms);
    CHECK(resident == 0);
    CHECK(offloaded >= 1.5 * resident_plain);
    CHECK(io_ms > 0);  // on the CPU override every copy is a synchronous memcpy
    CHECK(update_ms > 0);
  }
}

TEST_CASE("optimizer nvme: SIGKILL after step 12 and restart continues bit-exactly and leaves no file") {
  auto& p = Parity::get();
  const RunResult& straight = nvme_run(0);
  const std::string dir = offload_dir("killed");
  auto [code, output] = launch_raw("nvme_killed", with(with(layout(0), nvme(dir)),
                                                       {"checkpoint.every=5", "cluster.max_restarts=1",
                                                        "fault.kind=kill_after_step", "fault.rank=1", "fault.step=12"}));
  INFO(output);
  REQUIRE(code == 0);
  CHECK(output.find("resuming from step 10") != std::string::npos);
  const auto got = losses_by_step(p.dir / "nvme_killed/metrics.jsonl");
  REQUIRE(got.size() == size_t(kSteps));
  int differ = 0;
  for (int s = 1; s <= kSteps; ++s) differ += got.at(s) != straight.losses[size_t(s - 1)];
  const auto left = left_in(dir);
  MESSAGE("nvme restart: " << differ << " of " << kSteps << " losses differ from the straight run; " << left.size()
                           << " files left under the offload path");
  CHECK(differ == 0);
  CHECK(left.empty());
}

TEST_CASE("checkpoints: written with nvme offload resume without it, and the reverse (1e-5; control: moments reset)") {
  auto& p = Parity::get();
  const RunResult& plain = plain_run(0);
  const RunResult& offloaded = nvme_run(0);
  const auto want = losses_by_step(p.dir / "plain_z0/metrics.jsonl");
  // nvme's step_10, resumed on the device's memory.
  auto [c1, o1] = launch_raw("plain_from_nvme", with(ranks(2, 4), {"checkpoint.every=0"}),
                             {"--resume-from", p.dir / "nvme_z0/ckpt/step_10"});
  INFO(o1);
  REQUIRE(c1 == 0);
  const ResumeDiffs d1 = resume_diffs("plain_from_nvme", 10, want, plain.params);
  // The plain run's step_10, resumed with the moments in files.
  const std::string dir = offload_dir("from_plain");
  auto [c2, o2] = launch_raw("nvme_from_plain", with(with(ranks(2, 4), nvme(dir)), {"checkpoint.every=0"}),
                             {"--resume-from", p.dir / "plain_z0/ckpt/step_10"});
  INFO(o2);
  REQUIRE(c2 == 0);
  const ResumeDiffs d2 = resume_diffs("nvme_from_plain", 10, want, offloaded.params);
  MESSAGE("nvme step_10 -> none: max loss rel diff " << d1.loss_rel << ", max param abs diff " << d1.param_abs
                                                     << "; none step_10 -> nvme: " << d2.loss_rel << ", "
                                                     << d2.param_abs << " (tol " << kLossRelTol << ", "
                                                     << kParamAbsTol << ")");
  CHECK(d1.loss_rel <= kLossRelTol);
  CHECK(d1.param_abs <= kParamAbsTol);
  CHECK(d2.loss_rel <= kLossRelTol);
  CHECK(d2.param_abs <= kParamAbsTol);
  CHECK(left_in(dir).empty());
  // Control: the resume into offload with the moments zeroed on load.
  auto [c3, o3] = launch_raw("nvme_from_plain_reset",
                             with(with(ranks(2, 4), nvme(offload_dir("reset"))),
                                  {"checkpoint.every=0", "fault.kind=reset_moments_on_load"}),
                             {"--resume-from", p.dir / "plain_z0/ckpt/step_10"});
  INFO(o3);
  REQUIRE(c3 == 0);
  check_resume_control("none step_10 -> nvme", resume_diffs("nvme_from_plain_reset", 10, want, offloaded.params));
}

namespace {

// Damages rank 1's offload file `file_name` after step 7 (fault.kind
// offload_truncate, then offload_delete) in runs named prefix + kind with
// `sets(dir)`: the job stops naming the file, never by SIGBUS, `latest`
// stays on step 5, and nothing is left under train.offload.path (rank 0,
// stopped by SIGTERM or SIGKILL while it waited for rank 1: the launcher
// removes what it left).
void check_damaged_file_stops(const std::string& prefix, const std::string& file_name,
                              const std::function<std::vector<std::string>(const std::string&)>& sets) {
  auto& p = Parity::get();
  for (const std::string kind : {"offload_truncate", "offload_delete"}) {
    const std::string name = prefix + kind;
    const std::string dir = offload_dir(name);
    auto [code, output] = launch_raw(name, with(sets(dir), {"checkpoint.every=5", "cluster.max_restarts=0",
                                                            "cluster.grace_s=1", "fault.kind=" + kind,
                                                            "fault.rank=1", "fault.step=7"}));
    INFO(output);
    const std::string said = kind == "offload_truncate" ? "was truncated while the job ran" : "was deleted while the job ran";
    MESSAGE(name << ": exit " << code << ", latest " << read_latest(p.dir / name + "/ckpt"));
    CHECK(code != 0);
    CHECK(output.find(said) != std::string::npos);
    CHECK(output.find(file_name) != std::string::npos);
    CHECK(output.find("SIGBUS") == std::string::npos);
    CHECK(read_latest(p.dir / name + "/ckpt") == "step_5");
    CHECK(fs::exists(p.dir / name + "/ckpt/step_5/index.json"));
    CHECK(left_in(dir).empty());
  }
}

}  // namespace

TEST_CASE("an offload file truncated or deleted mid-run stops the job naming it; the previous checkpoint stays") {
  check_damaged_file_stops("nvme_", "dtrain-offload-parity-rank1.bin",
                           [](const std::string& dir) { return with(layout(0), nvme(dir)); });
}

TEST_CASE("bad input: train.offload refused before any worker, naming the field and the fix") {
  auto& p = Parity::get();
  write_file(p.dir / "not_a_dir", "x");
  fs::create_directories(p.dir / "bad_ckpt/inside");
  struct Case {
    std::string name;
    std::vector<std::string> sets;
    std::string said;
    std::vector<std::string> env = {};
    std::vector<std::string> args = {};
  };
  const std::vector<Case> cases = {
      {"no_path", {"train.offload.optimizer=nvme"}, "train.offload.path"},
      {"missing", {"train.offload.optimizer=nvme", "train.offload.path=" + p.dir / "nope"}, "does not exist"},
      {"file", {"train.offload.optimizer=nvme", "train.offload.path=" + p.dir / "not_a_dir"}, "is not a directory"},
      {"in_ckpt",
       {"train.offload.optimizer=nvme", "train.offload.path=" + p.dir / "bad_ckpt/inside",
        "checkpoint.dir=" + p.dir / "bad_ckpt"},
       "lies in checkpoint.dir"},
      {"full",
       {"train.offload.optimizer=nvme", "train.offload.path=" + p.dir.path(), "model.layers=96", "model.d_model=28672"},
       "free; the offload files",
       {},
       {"--allow-large"}},  // past the memory check, which would refuse 1e12 parameters first
      {"params_zero0", {"train.offload.params=nvme", "train.offload.path=" + p.dir.path()}, "only ZeRO-3"},
      {"host_cpu", {"train.offload.optimizer=host"}, "use nvme"},
      {"host_no_gpu",
       {"train.offload.optimizer=host", "cluster.device=cuda"},
       "train.offload.optimizer = host on a machine without a GPU",
       {"CUDA_VISIBLE_DEVICES="}},
      {"params_host_no_gpu",
       {"train.offload.params=host", "parallel.zero=3", "cluster.device=cuda"},
       "train.offload.params = host on a machine without a GPU",
       {"CUDA_VISIBLE_DEVICES="}},
      {"params_host_cpu", {"train.offload.params=host", "parallel.zero=3"}, "train.offload.params = host with "
                                                                            "cluster.device = cpu"},
      {"params_nvme_no_gpu",
       {"train.offload.params=nvme", "train.offload.path=" + p.dir.path(), "parallel.zero=3", "cluster.device=cuda"},
       "cluster.device = cuda, but this machine shows no NVIDIA GPU",
       {"CUDA_VISIBLE_DEVICES="}},
      {"bucket", {"train.offload.optimizer=nvme", "train.offload.path=" + p.dir.path(), "train.offload.bucket_mb=0"},
       "train.offload.bucket_mb = 0"},
  };
  for (const Case& c : cases) {
    TagGuard tag;
    std::vector<std::string> argv = {dtrain_bin(), "launch", p.dir / "spec.yaml", "--set",
                                     "log.dir=" + p.dir / ("bad_" + c.name)};
    for (const auto& s : c.sets) argv.insert(argv.end(), {"--set", s});
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::vector<std::string> env = c.env;
    env.insert(env.end(), {tag.env(), "DTRAIN_NO_REBUILD=1"});
    auto [code, output] = run_command(argv, p.dir / ("bad_" + c.name + ".log"), 60, env);
    INFO(c.name << " output:\n" << output);
    CHECK(code == 2);
    CHECK(output.find(c.said) != std::string::npos);
    CHECK(output.find("rank 0") == std::string::npos);  // no worker started
  }
}

TEST_CASE("params nvme vs none, ZeRO-3 dp 2: parity, shards out of memory, nothing left behind") {
  auto& p = Parity::get();
  const RunResult& plain = params_plain_run();
  const RunResult& run = params_run();
  CHECK(run.output.find("parameter shards") != std::string::npos);
  CHECK(left_in(p.dir / "offload_params_nvme").empty());  // each rank removed its file
  // The control: updated shards never written back (the parameters never change).
  const std::string cname = "params_nowb";
  const RunResult control = launch(p.dir, cname, with(with(params_layout(), params_nvme(offload_dir(cname))),
                                                      {"fault.kind=offload_no_writeback"}));
  compare("ZeRO-3 dp2 params nvme vs none", run, &control, plain, "shards never written back");
  CHECK(left_in(p.dir / ("offload_" + cname)).empty());
  // Shard bytes in memory: all of them without offload; with it the most
  // at once during the step (in use, read ahead, being written back).
  const double shards_plain = last_metric("params_plain", "param_bytes");
  const double resident = last_metric("params_nvme", "param_bytes");
  const double offloaded = last_metric("params_nvme", "offload_bytes");
  const double gathered = 4.0 * double(largest_unit(plain.params) + 1);  // + 1: the padding to dp 2
  const double peak_plain = last_metric("params_plain", "peak_bytes"), peak = last_metric("params_nvme", "peak_bytes");
  MESSAGE("params nvme: shard bytes in memory " << shards_plain << " without offload, at most " << resident
                                                << " with; bound: two gathered units of " << gathered
                                                << " B = " << 2 * gathered << "; offload_bytes " << offloaded
                                                << "; the step's measured CPU peak " << peak_plain << " -> " << peak);
  CHECK(offloaded == shards_plain);  // the file holds every shard
  CHECK(resident > 0);
  CHECK(resident < 2 * gathered);
  CHECK(shards_plain >= 2 * gathered);  // the bound means something at this size
  CHECK(peak < peak_plain);             // the counting allocator sees the shards gone
  CHECK(last_metric("params_nvme", "offload_io_ms") > 0);
}

TEST_CASE("params host on a CPU (test override) vs none, ZeRO-3 dp 2: parity, shards off the device between uses") {
  // The override runs host's path on the CPU: each shard waits in a host
  // buffer of its own, its tensor holding zero bytes, as under nvme.
  const std::vector<std::string> env = {std::string(dtrain::kHostOffloadOnCpuEnv) + "=1"};
  auto& p = Parity::get();
  const RunResult& plain = params_plain_run();
  const RunResult run = launch(p.dir, "params_host", with(params_layout(), {"train.offload.params=host"}), env);
  CHECK(run.output.find("parameter shards") != std::string::npos);
  CHECK(run.output.find("in host memory between uses") != std::string::npos);
  // The control: updated shards never copied back (the parameters never change).
  const RunResult control = launch(
      p.dir, "params_host_nocopy",
      with(params_layout(), {"train.offload.params=host", "fault.kind=offload_no_writeback"}), env);
  compare("ZeRO-3 dp2 params host (CPU override) vs none", run, &control, plain, "shards never copied back");
  const double shards_plain = last_metric("params_plain", "param_bytes");
  const double resident = last_metric("params_host", "param_bytes");
  const double offloaded = last_metric("params_host", "offload_bytes");
  const double gathered = 4.0 * double(largest_unit(plain.params) + 1);  // + 1: the padding to dp 2
  MESSAGE("params host: shard bytes on the device " << shards_plain << " without offload, at most " << resident
                                                    << " with; bound: two gathered units = " << 2 * gathered
                                                    << " B; offload_bytes " << offloaded);
  CHECK(offloaded == shards_plain);  // the host buffer holds every shard
  CHECK(resident > 0);
  CHECK(resident < 2 * gathered);
}

TEST_CASE("checkpoints: written with params nvme resume without it, and the reverse (1e-5)") {
  auto& p = Parity::get();
  const RunResult& plain = params_plain_run();
  const RunResult& offloaded = params_run();
  const auto want = losses_by_step(p.dir / "params_plain/metrics.jsonl");
  const std::vector<std::string> resumed = with(ranks(2, 4), {"parallel.zero=3", "model.layers=4", "checkpoint.every=0"});
  auto [c1, o1] = launch_raw("plain_from_params", resumed, {"--resume-from", p.dir / "params_nvme/ckpt/step_10"});
  INFO(o1);
  REQUIRE(c1 == 0);
  const ResumeDiffs d1 = resume_diffs("plain_from_params", 10, want, plain.params);
  const std::string dir = offload_dir("params_from_plain");
  auto [c2, o2] = launch_raw("params_from_plain", with(resumed, params_nvme(dir)),
                             {"--resume-from", p.dir / "params_plain/ckpt/step_10"});
  INFO(o2);
  REQUIRE(c2 == 0);
  const ResumeDiffs d2 = resume_diffs("params_from_plain", 10, want, offloaded.params);
  MESSAGE("params nvme step_10 -> none: max loss rel diff " << d1.loss_rel << ", max param abs diff " << d1.param_abs
                                                            << "; none step_10 -> params nvme: " << d2.loss_rel << ", "
                                                            << d2.param_abs << " (tol " << kLossRelTol << ", "
                                                            << kParamAbsTol << ")");
  CHECK(d1.loss_rel <= kLossRelTol);
  CHECK(d1.param_abs <= kParamAbsTol);
  CHECK(d2.loss_rel <= kLossRelTol);
  CHECK(d2.param_abs <= kParamAbsTol);
  CHECK(left_in(dir).empty());
  // Control: the resume into params offload with the loaded shards never
  // written to the file (so the run trains nothing it loaded).
  auto [c3, o3] = launch_raw("params_from_plain_nowb",
                             with(with(resumed, params_nvme(offload_dir("params_nowb_resume"))),
                                  {"fault.kind=offload_no_writeback"}),
                             {"--resume-from", p.dir / "params_plain/ckpt/step_10"});
  INFO(o3);
  REQUIRE(c3 == 0);
  const ResumeDiffs d3 = resume_diffs("params_from_plain_nowb", 10, want, offloaded.params);
  MESSAGE("none step_10 -> params nvme with fault.kind offload_no_writeback (negative control): max loss rel diff "
          << d3.loss_rel << " (miss factor " << d3.loss_rel / kLossRelTol << "), max param abs diff " << d3.param_abs
          << " (miss factor " << d3.param_abs / kParamAbsTol << "); each must be >= " << kControlFactor);
  CHECK(d3.loss_rel >= kControlFactor * kLossRelTol);
  CHECK(d3.param_abs >= kControlFactor * kParamAbsTol);
}

TEST_CASE("a params offload file truncated or deleted mid-run stops the job naming it; the previous checkpoint stays") {
  check_damaged_file_stops("params_", "dtrain-offload-parity-rank1.params.bin",
                           [](const std::string& dir) { return with(params_layout(), params_nvme(dir)); });
}

TEST_CASE("optimizer nvme vs none under TP 2 and PP 2: parity, control offload_no_writeback") {
  struct Layout {
    std::string name;
    std::vector<std::string> sets;
  };
  const std::vector<Layout> layouts = {
      {"tp2", {"cluster.procs_per_node=2", "parallel.tp=2", "train.micro_batch=8"}},
      {"pp2", {"cluster.procs_per_node=2", "parallel.pp=2", "train.micro_batch=4", "train.grad_accum=2",
               "parallel.pipeline.schedule=1f1b"}},
  };
  auto& p = Parity::get();
  for (const Layout& l : layouts) {
    const RunResult& plain = p.cached("plain_" + l.name, l.sets);
    const RunResult& run = p.cached("nvme_" + l.name, with(l.sets, nvme(offload_dir("nvme_" + l.name))));
    const std::string cname = "nvme_nowb_" + l.name;
    const RunResult control =
        launch(p.dir, cname, with(with(l.sets, nvme(offload_dir(cname))), {"fault.kind=offload_no_writeback"}));
    compare(l.name + " optimizer nvme vs none", run, &control, plain, "moments never written back");
    CHECK(left_in(p.dir / ("offload_nvme_" + l.name)).empty());
  }
}
