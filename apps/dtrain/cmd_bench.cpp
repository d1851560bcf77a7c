// `dtrain bench comm --op OP --min 1K --max 64M -n 4`: launches n local
// workers running `dtrain-worker bench-comm` through launcher::launch (a job
// spec built here: one node, dp = n) and shows rank 0's nccl-tests style
// table. CLI only: the measurement is engine/comm/comm_bench.cpp.
#include <unistd.h>

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
};

int run_bench_comm(const BenchCommArgs& a) {
  if (a.n < 1 || a.iters < 1)
    throw Error(ErrorCode::config,
                "-n " + std::to_string(a.n) + " --iters " + std::to_string(a.iters) +
                    ": both must be >= 1",
                "e.g. dtrain bench comm --op all_reduce -n 4");
  JobSpec spec;
  spec.job.name = "bench-comm";
  spec.cluster.procs_per_node = a.n;
  spec.parallel.dp = a.n;
  spec.entrypoint = {launcher::self_dir() + "/dtrain-worker", "bench-comm", "--op", a.op,
                     "--min", a.min, "--max", a.max, "--iters", std::to_string(a.iters),
                     "--dtype", a.dtype};
  spec.log.dir = (std::filesystem::temp_directory_path() /
                  ("dtrain-bench-comm-" + std::to_string(::getpid())))
                     .string();
  if (::access(spec.entrypoint[0].c_str(), X_OK) != 0)
    throw Error(ErrorCode::config, spec.entrypoint[0] + " does not exist",
                "build the dtrain-worker target (the LibTorch engine) next to dtrain");
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
  // Checked here too (the worker checks again), so a typo fails before any worker starts.
  comm->add_option("--op", args->op, "all_reduce|all_gather|reduce_scatter|all_to_all|broadcast")
      ->capture_default_str()
      ->check(CLI::IsMember({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}));
  comm->add_option("--min", args->min, "smallest size in bytes (K/M/G suffixes)")
      ->capture_default_str();
  comm->add_option("--max", args->max, "largest size in bytes (doubling from --min)")
      ->capture_default_str();
  comm->add_option("-n,--nprocs", args->n, "local workers (ranks)")->capture_default_str();
  comm->add_option("--iters", args->iters, "timed repeats per size (median)")
      ->capture_default_str();
  comm->add_option("--dtype", args->dtype, "fp32|fp16|bf16")->capture_default_str();
  comm->callback([args, &exit_code] { exit_code = run_bench_comm(*args); });
}

}  // namespace

DTRAIN_REGISTER_COMMAND(60, add_bench);

}  // namespace dtrain::app
