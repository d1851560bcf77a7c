// dtrain-worker: what `entrypoint: builtin` runs on every rank. Reads who it is from the
// environment (docs/ARCHITECTURE.md, 'The worker's environment'), never from the launcher.
//   dtrain-worker                 train (the default); evaluate a checkpoint when
//                                 DTRAIN_EVAL_CKPT is set (`dtrain eval`)
//   dtrain-worker bench-comm ...  one collective, nccl-tests style
//   dtrain-worker doctor          the engine's facts as JSON on stdout (dtrain doctor reads it)
//   dtrain-worker bench-attention ...  one attention core forward + backward
//   dtrain-worker probe-matmul    this CPU's fp32 GEMM rate, "gflops=X" (dtrain plan)
#include <malloc.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <iostream>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include "apps/dtrain-worker/round_channel.h"
#include "apps/dtrain-worker/warm_spare.h"
#include "common/error.h"
#include "common/error_file.h"
#include "common/log.h"
#include "engine/comm/comm_bench.h"
#include "engine/doctor/engine_facts.h"
#include "engine/device/matmul_probe.h"
#include "engine/model/attention_bench.h"
#include "engine/trainer/current_step.h"
#include "engine/trainer/evaluation.h"
#include "engine/trainer/mfu.h"
#include "engine/trainer/trainer.h"

namespace {

int64_t parse_size(const std::string& s) {
  // 1K, 64M, 1G, or plain bytes.
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  if (unit == "K" || unit == "k") v *= 1024;
  else if (unit == "M" || unit == "m") v *= 1024 * 1024;
  else if (unit == "G" || unit == "g") v *= 1024.0 * 1024 * 1024;
  else if (!unit.empty())
    throw dtrain::Error(dtrain::ErrorCode::config, "size '" + s + "' has unknown unit '" + unit + "'",
                        "use a number with an optional K, M or G suffix, e.g. 64M");
  return static_cast<int64_t>(v);
}

// Every training step allocates and frees the same activation and gradient
// sizes. glibc serves large blocks with mmap and gives freed heap back to the
// kernel, so each step would fault the same pages in again (zeroed by the
// kernel). Keep them in the heap instead: about 5% more tokens/s at 4 ranks
// on 2 cores (bench/results/peer_ratio.txt). MALLOC_* variables still win.
void keep_freed_memory_in_heap() {
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 512 << 20);
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

// What the agent shows as the root cause: the message, this rank and the
// step it failed in, in DTRAIN_ERROR_FILE (TORCHELASTIC_ERROR_FILE when only
// that is set, as under torchrun). Nothing when neither is set. `code`: the
// dtrain::Error's code name, "" for other exceptions.
void write_error_file(const std::string& message, const std::string& code = "") {
  const char* path = std::getenv("DTRAIN_ERROR_FILE");
  if (!path || !*path) path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return;
  dtrain::ErrorFileRecord record;
  record.message = message;
  record.error_code = code;
  const char* rank = std::getenv("RANK");
  record.rank = rank ? std::atoi(rank) : -1;
  const int64_t step = dtrain::engine::trainer::current_step();
  record.step = step > 0 ? step : -1;
  record.time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  if (!dtrain::write_error_file(path, record))
    std::cerr << "dtrain-worker: could not write the error file " << path << "\n";
}

// An exception that escapes a thread other than main's ends in
// std::terminate: record it too, then abort as the default handler does.
[[noreturn]] void terminate_with_error_file() {
  std::string message = "std::terminate called without an active exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      message = std::string("uncaught exception: ") + ex.what();
    } catch (...) {
      message = "uncaught exception of an unknown type";
    }
  }
  std::cerr << "dtrain-worker: " << message << "\n";
  write_error_file(message);
  std::abort();
}

// How long a worker whose round failed on its own error (config, checkpoint,
// internal) waits for a notice already on its way before failing.
constexpr double kNoticeGraceS = 0.5;

// Training, round after round in this process when the agent recovers in
// place (round_channel.h): a round the agent ends (its notice shuts the
// sockets, so the pending collective throws) is left, the engine's state
// dropped with it (its groups leaked, train_session.h), and run_training()
// starts again from the new environment, restoring as a new worker would
// (peer memory or disk). A communication failure with no notice within
// DTRAIN_ROUND_WAIT_S is this worker's own: it ends the process as without a
// channel; so does any other failure (may_be_round_change) unless a notice
// has already come, or (its own error: config, checkpoint, internal) comes
// within kNoticeGraceS.
int train_rounds() {
  auto channel = dtrain::worker::RoundChannel::open_if_enabled();
  if (!channel) return dtrain::engine::trainer::run_training();
  const char* wait = std::getenv(dtrain::worker::kRoundWaitEnv);
  const double wait_s = wait && *wait ? std::atof(wait) : 10.0;
  for (;;) {
    int rc = 0;
    std::exception_ptr failure;
    std::string what;
    bool own = false;  // a failure no round change explains, unless a notice is on its way
    try {
      rc = dtrain::engine::trainer::run_training();
    } catch (const dtrain::Error& e) {
      // Bad input, a checkpoint that does not verify, our bug: this rank's
      // own failure, which no round change explains. Fail now, not after
      // the wait (the agent stops the job or restarts it as without a
      // channel), unless a newer round's notice is already there or on its
      // way (the agent writes the round's spec file, then the notice: a
      // worker that began the round before reads the newer spec, 'the file
      // holds another round's spec').
      own = e.code() == dtrain::ErrorCode::config || e.code() == dtrain::ErrorCode::checkpoint ||
            e.code() == dtrain::ErrorCode::internal;
      failure = std::current_exception();
      what = e.what();
    } catch (const std::exception& e) {
      failure = std::current_exception();
      what = e.what();
    }
    auto env = channel->next(own                                            ? kNoticeGraceS
                             : dtrain::worker::may_be_round_change(failure) ? wait_s
                                                                            : 0.0);
    if (!env) {
      if (failure) std::rethrow_exception(failure);
      return rc;
    }
    dtrain::worker::replace_environment(*env);
    const char* rank = std::getenv("RANK");
    const char* world = std::getenv("WORLD_SIZE");
    dtrain::log::init("worker", rank ? std::atoi(rank) : 0, world ? std::atoi(world) : 1);
    DTRAIN_INFO("pid {} continues as rank {} of {} in the new round (recovery in place){}", ::getpid(),
                rank ? rank : "?", world ? world : "?",
                failure ? "; the old round ended in: " + what.substr(0, what.find('\n')) : std::string());
  }
}

// A warm spare measures the matmul rate its rank's MFU needs (mfu.h) from the
// round's spec it started with (same precision and device every round), so
// that the restart which takes it does not. Best effort: anything wrong
// here is found again, and reported, once the spare has its rank.
void premeasure_if_spare() {
  const char* spare = std::getenv("DTRAIN_WARM_SPARE");
  const char* spec = std::getenv("DTRAIN_SPEC");
  if (!spare || !*spare || !spec || !*spec) return;
  try {
    at::set_num_threads(1);  // the per-thread rate, as the rank runs
    dtrain::engine::trainer::premeasure_cpu_peak(dtrain::load_job_spec(spec));
  } catch (const std::exception&) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  // If the agent dies (even by SIGKILL), take the worker down with it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // A write to a peer that is gone (a Gloo pair, a closed pipe) returns EPIPE
  // and throws, named, instead of killing the rank by signal: what Python
  // does for torchrun's workers.
  ::signal(SIGPIPE, SIG_IGN);
  // A warm spare waits here, libraries loaded and its matmul rate measured,
  // for the rank a restart gives it.
  premeasure_if_spare();
  if (!dtrain::worker::wait_for_rank_if_spare()) return 0;
  keep_freed_memory_in_heap();
  std::set_terminate(terminate_with_error_file);
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  dtrain::log::init("worker", rank ? std::atoi(rank) : 0, world ? std::atoi(world) : 1);

  CLI::App app{"dtrain-worker: the LibTorch engine of one rank"};
  auto* bench = app.add_subcommand("bench-comm", "measure one collective (nccl-tests style)");
  dtrain::engine::comm::CommBenchOptions bopt;
  std::string min_s = "1K", max_s = "64M";
  bench->add_option("--op", bopt.op, "all_reduce|all_gather|reduce_scatter|all_to_all|broadcast");
  bench->add_option("--min", min_s, "smallest size in bytes (K/M/G suffixes)");
  bench->add_option("--max", max_s, "largest size in bytes");
  bench->add_option("--iters", bopt.iters, "timed repeats per size");
  bench->add_option("--dtype", bopt.dtype, "fp32|fp16|bf16");
  bench->add_option("--reduce-scatter", bopt.reduce_scatter, "ring|native");
  bench->add_option("--hier", bopt.hierarchical, "hierarchical all-reduce across nodes (true|false)");
  bench->add_option("--registered", bopt.registered,
                    "all_reduce in the group's symmetric buffer, as DDP's buckets (true|false)");
  auto* doctor = app.add_subcommand("doctor", "BLAS, kernels, versions, GPUs and matmul rates as JSON");
  double doctor_seconds = 0.4;
  doctor->add_option("--seconds", doctor_seconds, "budget of each matmul rate measurement");
  auto* attn = app.add_subcommand("bench-attention", "time one attention core forward + backward, and its peak");
  dtrain::engine::model::AttentionBenchOptions aopt;
  attn->add_option("--kind", aopt.kind, "naive|tiled");
  attn->add_option("--seq", aopt.seq, "sequence length T");
  attn->add_option("--batch", aopt.batch, "batch rows");
  attn->add_option("--heads", aopt.heads, "heads");
  attn->add_option("--head-dim", aopt.head_dim, "head dim D");
  attn->add_option("--dropout", aopt.dropout, "dropout of the probabilities");
  attn->add_option("--iters", aopt.iters, "timed repeats after one warm-up");
  auto* probe = app.add_subcommand("probe-matmul", "print this CPU's one-thread fp32 GEMM rate (gflops=X)");
  try {
    app.parse(argc, argv);
    if (*doctor) {
      at::set_num_threads(1);  // the per-thread rate, as one rank runs
      std::cout << dtrain::engine_facts_to_json(dtrain::engine::doctor::probe_engine(doctor_seconds)) << "\n";
      return 0;
    }
    if (*probe) {
      std::cout << "gflops=" << dtrain::engine::device::probe_matmul_gflops() << "\n";
      return 0;
    }
    if (*attn) return dtrain::engine::model::run_attention_bench(aopt);
    if (*bench) {
      bopt.min_bytes = parse_size(min_s);
      bopt.max_bytes = parse_size(max_s);
      return dtrain::engine::comm::run_comm_bench(bopt);
    }
    // `dtrain eval` launches the same workers with the checkpoint to evaluate.
    if (const char* eval = std::getenv("DTRAIN_EVAL_CKPT"); eval && *eval)
      return dtrain::engine::trainer::run_evaluation();
    return train_rounds();
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const dtrain::Error& e) {
    std::cerr << "dtrain-worker: error: " << e.message() << "\n";
    if (!e.hint().empty()) std::cerr << "  fix: " << e.hint() << "\n";
    write_error_file(e.message() + (e.hint().empty() ? "" : "\nfix: " + e.hint()), dtrain::error_code_name(e.code()));
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "dtrain-worker: error: " << e.what() << "\n";
    write_error_file(e.what());
    return 1;
  }
}
