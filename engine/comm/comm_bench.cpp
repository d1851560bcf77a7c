// run_comm_bench: nccl-tests style timing of one collective over the world
// group. Every rank verifies its result against the expected buffer (small
// integers, so fp16/bf16 are exact too); rank 0 prints the table. Sizes are
// the whole buffer as nccl-tests counts it (for reduce_scatter the input, for
// all_gather the output). It launches nothing: `dtrain bench comm` does.
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "common/error.h"
#include "engine/comm/comm.h"
#include "engine/comm/comm_bench.h"
#include "engine/comm/symmetric_buffer.h"

namespace dtrain::engine::comm {

namespace {

const char* const kOps[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"};

// nccl-tests' bus bandwidth correction factors.
double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

at::ScalarType parse_dtype(const std::string& d) {
  if (d == "fp32") return at::kFloat;
  if (d == "fp16") return at::kHalf;
  if (d == "bf16") return at::kBFloat16;
  throw Error(ErrorCode::config, "--dtype " + d + " is not known", "use fp32, fp16 or bf16");
}

// Rank q's input of `count` elements: small integers, exact in every dtype
// and in sums over a few ranks.
at::Tensor bench_input(int q, int64_t count, at::ScalarType dtype) {
  auto i = at::arange(count, at::TensorOptions().dtype(at::kFloat));  // [count]
  return ((i + 3 * q).fmod(7) + q).to(dtype);
}

// One size of one op: buffers, the operation, and the buffer it must produce.
struct Case {
  at::Tensor in, out, expect;
  std::vector<int64_t> splits;
};

Case make_case(const std::string& op, int n, int r, int64_t count, at::ScalarType dt) {
  Case c;
  const int64_t m = count / n;  // per-rank chunk
  c.splits.assign(n, m);
  if (op == "all_reduce") {
    c.in = bench_input(r, count, dt);
    c.expect = at::zeros({count}, at::kFloat);
    for (int q = 0; q < n; ++q) c.expect += bench_input(q, count, at::kFloat);
  } else if (op == "all_gather") {
    c.in = bench_input(r, m, dt);  // [m] -> out [n*m]
    c.out = at::empty({count}, c.in.options());
    c.expect = at::empty({count}, at::kFloat);
    for (int q = 0; q < n; ++q) c.expect.narrow(0, q * m, m).copy_(bench_input(q, m, at::kFloat));
  } else if (op == "reduce_scatter") {
    c.in = bench_input(r, count, dt);  // [n*m] -> out [m]
    c.out = at::empty({m}, c.in.options());
    c.expect = at::zeros({m}, at::kFloat);
    for (int q = 0; q < n; ++q) c.expect += bench_input(q, count, at::kFloat).narrow(0, r * m, m);
  } else if (op == "all_to_all") {
    c.in = bench_input(r, count, dt);  // block j of [n*m] goes to rank j
    c.out = at::empty({count}, c.in.options());
    c.expect = at::empty({count}, at::kFloat);
    for (int q = 0; q < n; ++q)
      c.expect.narrow(0, q * m, m).copy_(bench_input(q, count, at::kFloat).narrow(0, r * m, m));
  } else {  // broadcast from rank 0
    c.in = bench_input(r, count, dt);
    c.expect = bench_input(0, count, at::kFloat);
  }
  return c;
}

// Runs the op once (inputs ready, ranks aligned); returns this rank's result.
at::Tensor run_op(Group& g, const std::string& op, Case& c) {
  if (op == "all_reduce") g.all_reduce(c.in);
  else if (op == "broadcast") g.broadcast(c.in, 0);
  else if (op == "all_gather") g.all_gather(c.in, c.out);
  else if (op == "reduce_scatter") g.reduce_scatter(c.in, c.out);
  else g.all_to_all(c.in, c.out, c.splits, c.splits);
  return c.out.defined() ? c.out : c.in;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

}  // namespace

int run_comm_bench(const CommBenchOptions& options) {
  if (std::find(std::begin(kOps), std::end(kOps), options.op) == std::end(kOps))
    throw Error(ErrorCode::config, "--op " + options.op + " is not a collective",
                "use all_reduce, all_gather, reduce_scatter, all_to_all or broadcast");
  if (options.min_bytes < 1 || options.max_bytes < options.min_bytes || options.iters < 1)
    throw Error(ErrorCode::config,
                "--min " + std::to_string(options.min_bytes) + " --max " +
                    std::to_string(options.max_bytes) + " --iters " +
                    std::to_string(options.iters) + " are not a range",
                "use 1 <= min <= max and iters >= 1");
  const at::ScalarType dt = parse_dtype(options.dtype);
  at::set_num_threads(1);  // one core per rank, as in training
  if (options.reduce_scatter != "ring" && options.reduce_scatter != "native")
    throw Error(ErrorCode::config, "--reduce-scatter " + options.reduce_scatter + ": not a reduce-scatter path",
                "use ring (dtrain's, the default) or native (Gloo's own)");
  CommOptions copt;
  copt.gloo_native_reduce_scatter = options.reduce_scatter == "native";
  copt.hierarchical = options.hierarchical;
  auto comm = init_comm(WorldInfo::from_env(), copt);
  Group& g = comm->world();
  const int n = g.size(), r = g.rank();
  const int64_t esize = at::elementSize(dt);
  if (r == 0) {
    std::printf("# dtrain bench comm: %s, %d ranks (gloo, path %s), %s, median of %d iters, %d warmup\n",
                options.op.c_str(), n, g.path().c_str(), options.dtype.c_str(), options.iters, options.warmup);
    if (options.op == "reduce_scatter")
      std::printf("# reduce_scatter path: %s (--reduce-scatter ring | native)\n",
                  copt.gloo_native_reduce_scatter ? "native, Gloo's own" : "ring, ours over Gloo send/recv");
    std::printf("# %12s %12s %6s %11s %11s %11s %6s\n", "size(B)", "count", "type", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "check");
  }
  if (options.registered && options.op != "all_reduce")
    throw Error(ErrorCode::config, "--registered true with --op " + options.op,
                "registered (symmetric) buffers apply to all_reduce only: drop --registered");
  // --registered: one symmetric buffer for the largest size; each size's
  // input is its first `count` elements (as a bucket is a range of DDP's).
  at::Tensor arena;
  if (options.registered) {
    const int64_t most = std::max<int64_t>(n, options.max_bytes / esize / n * n);
    arena = symmetric_buffer(g, most, dt);
  }
  if (r == 0 && options.registered)
    std::printf("# registered: %s\n", arena.defined() ? "the input is a range of the group's symmetric buffer"
                                                       : "no symmetric buffer on this group: private tensors");
  int failures = 0;
  for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    const int64_t count = std::max<int64_t>(n, bytes / esize / n * n);  // divisible by n
    Case c = make_case(options.op, n, r, count, dt);
    if (arena.defined()) {
      at::Tensor in = arena.narrow(0, 0, count);
      in.copy_(c.in);
      c.in = in;
    }
    const at::Tensor pristine = c.in.clone();
    std::vector<double> times;
    at::Tensor result;
    for (int it = 0; it < options.warmup + options.iters; ++it) {
      if (!c.out.defined()) c.in.copy_(pristine);  // in-place ops: fresh input, untimed
      g.barrier();
      auto t0 = std::chrono::steady_clock::now();
      result = run_op(g, options.op, c);
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (it >= options.warmup) times.push_back(us);
    }
    // Mean over ranks of each repeat's time, then the median over repeats;
    // and the number of ranks whose result was wrong.
    at::Tensor stats = at::empty({static_cast<int64_t>(times.size()) + 1}, at::kDouble);
    for (size_t i = 0; i < times.size(); ++i) stats[i] = times[i];
    bool ok = (result.to(at::kFloat) - c.expect).abs().max().item().toDouble() == 0.0;
    stats[static_cast<int64_t>(times.size())] = ok ? 0.0 : 1.0;
    g.all_reduce(stats);
    std::vector<double> mean_times;
    for (size_t i = 0; i < times.size(); ++i) mean_times.push_back(stats[i].item().toDouble() / n);
    int wrong = static_cast<int>(stats[static_cast<int64_t>(times.size())].item().toDouble());
    failures += wrong;
    if (r == 0) {
      double us = median(mean_times), size = static_cast<double>(count * esize);
      double algbw = size / (us * 1e-6) / 1e9;
      std::printf("  %12lld %12lld %6s %11.1f %11.3f %11.3f %6s\n", static_cast<long long>(size),
                  static_cast<long long>(count), options.dtype.c_str(), us, algbw,
                  algbw * bus_factor(options.op, n), wrong ? "WRONG" : "ok");
      std::fflush(stdout);
    }
  }
  g.barrier();
  if (r == 0 && failures)
    std::printf("# %d wrong results: the collective is broken\n", failures);
  return failures ? 1 : 0;
}

}  // namespace dtrain::engine::comm
