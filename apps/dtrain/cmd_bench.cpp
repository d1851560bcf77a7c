// `dtrain bench comm --op OP --min 1K --max 64M -n 4`: launches n local
// workers running `dtrain-worker bench-comm` through launcher::launch (a job
// spec built here: one node, dp = n) and shows rank 0's nccl-tests style
// table. CLI only: the measurement is engine/comm/comm_bench.cpp. Every
// argument is checked here, before a worker starts; the run's temporary
// log directory is removed on every way out.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "apps/dtrain/command.h"
#include "common/error.h"
#include "common/job_spec.h"
#include "launcher/launch.h"

namespace dtrain::app {
namespace {

struct BenchCommArgs {
  std::string op = "all_reduce";
  std::string min = "1K", max = "64M";
  int n = 4;
  int iters = 5;
  std::string dtype = "fp32";
  std::string reduce_scatter = "ring";
};

const char* const kOps[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                           "broadcast"};
const char* const kDtypes[] = {"fp32", "fp16", "bf16"};
const char* const kReduceScatter[] = {"ring", "native"};
constexpr double kMaxBenchBytes = 64.0 * (1ULL << 30);  // 64 GiB per buffer
constexpr int kMaxBenchProcs = 1024;

std::string joined(const char* const* items, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += (i ? (i + 1 == n ? " or " : ", ") : "") + std::string(items[i]);
  return out;
}

// "1K", "64M", "1G" or plain bytes, as dtrain-worker reads them.
double bench_size(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  bool ok = !s.empty() && end != s.c_str();
  if (unit == "K" || unit == "k") v *= 1024;
  else if (unit == "M" || unit == "m") v *= 1024.0 * 1024;
  else if (unit == "G" || unit == "g") v *= 1024.0 * 1024 * 1024;
  else if (!unit.empty()) ok = false;
  if (!ok || !std::isfinite(v) || v < 1 || v > kMaxBenchBytes)
    throw Error(ErrorCode::config,
                flag + " " + s + ": expected a size from 1 byte to 64G (a number with an optional "
                                 "K, M or G suffix)",
                "e.g. dtrain bench comm --min 1K --max 64M");
  return v;
}

void check_bench_args(const BenchCommArgs& a) {
  if (a.n < 1 || a.n > kMaxBenchProcs)
    throw Error(ErrorCode::config,
                "-n " + std::to_string(a.n) + ": the number of local workers must be in 1.." +
                    std::to_string(kMaxBenchProcs),
                "give -n 2 or more to time a collective");
  if (std::find(std::begin(kOps), std::end(kOps), a.op) == std::end(kOps))
    throw Error(ErrorCode::config, "--op " + a.op + ": not a collective dtrain can time",
                "use " + joined(kOps, std::size(kOps)));
  if (std::find(std::begin(kDtypes), std::end(kDtypes), a.dtype) == std::end(kDtypes))
    throw Error(ErrorCode::config, "--dtype " + a.dtype + ": not a dtype dtrain can time",
                "use " + joined(kDtypes, std::size(kDtypes)));
  if (std::find(std::begin(kReduceScatter), std::end(kReduceScatter), a.reduce_scatter) ==
      std::end(kReduceScatter))
    throw Error(ErrorCode::config, "--reduce-scatter " + a.reduce_scatter + ": not a reduce-scatter path",
                "use ring (dtrain's ring over Gloo send/recv, the default) or native (Gloo's own)");
  if (bench_size("--min", a.min) > bench_size("--max", a.max))
    throw Error(ErrorCode::config, "--min " + a.min + " is larger than --max " + a.max,
                "sizes double from --min up to --max; give --min <= --max");
}

// The bench's log.dir: made for one run, removed with everything in it on
// every way out of run_bench_comm (success, failure, exception, signal
// forwarded to the workers).
class TempRunDir {
 public:
  TempRunDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dtrain-bench-comm-XXXXXX").string();
    if (!::mkdtemp(tmpl.data()))
      throw Error(ErrorCode::internal, "cannot create a temporary directory like " + tmpl);
    path_ = tmpl;
  }
  ~TempRunDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempRunDir(const TempRunDir&) = delete;
  TempRunDir& operator=(const TempRunDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int run_bench_comm(const BenchCommArgs& a) {
  check_bench_args(a);
  JobSpec spec;
  spec.job.name = "bench-comm";
  spec.cluster.procs_per_node = a.n;
  spec.parallel.dp = a.n;
  spec.entrypoint = {launcher::self_dir() + "/dtrain-worker", "bench-comm", "--op", a.op,
                     "--min", a.min, "--max", a.max, "--iters", std::to_string(a.iters),
                     "--dtype", a.dtype, "--reduce-scatter", a.reduce_scatter};
  if (::access(spec.entrypoint[0].c_str(), X_OK) != 0)
    throw Error(ErrorCode::config, spec.entrypoint[0] + " does not exist",
                "build the dtrain-worker target (the LibTorch engine) next to dtrain");
  TempRunDir run_dir;
  spec.log.dir = run_dir.path();
  launcher::LaunchOptions options;
  options.node_rank = 0;
  options.console_ranks = {0};  // rank 0 prints the table; the others only check
  const int code = launcher::launch(spec, options);
  std::error_code ec;
  if (code == 0) std::filesystem::remove_all(spec.log.dir, ec);  // kept to debug a failure
  return code;
}

void add_bench(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "measurements (see bench/ for the full suites)");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchCommArgs>();
  auto* comm = bench->add_subcommand(
      "comm", "time one collective on n local workers, nccl-tests style (algbw, busbw, check)");
  // Checked by check_bench_args (the worker checks again), so a typo fails
  // with the option, the value and the choices before any worker starts.
  comm->add_option("--op", args->op, "all_reduce|all_gather|reduce_scatter|all_to_all|broadcast")
      ->capture_default_str();
  comm->add_option("--min", args->min, "smallest size in bytes (K/M/G suffixes)")
      ->capture_default_str();
  comm->add_option("--max", args->max, "largest size in bytes (doubling from --min)")
      ->capture_default_str();
  comm->add_option("-n,--nprocs", args->n, "local workers (ranks)")->capture_default_str();
  comm->add_option("--iters", args->iters, "timed repeats per size (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  comm->add_option("--dtype", args->dtype, "fp32|fp16|bf16")->capture_default_str();
  comm->add_option("--reduce-scatter", args->reduce_scatter,
                   "ring (dtrain's, over Gloo send/recv) | native (Gloo's own); as cluster.gloo_reduce_scatter")
      ->capture_default_str();
  comm->callback([args, &exit_code] { exit_code = run_bench_comm(*args); });
}

}  // namespace

DTRAIN_REGISTER_COMMAND(60, add_bench);

}  // namespace dtrain::app
