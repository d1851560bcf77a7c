// The seeded initial weights' draw (engine/model/param_init.h), serial vs on
// T threads (the walk of the generator on this thread, the chunks drawn from
// copies placed at their starts), wall time, interleaved rounds; the largest
// difference between the two draws (0 expected: the same numbers).
//   build/bench/init_draw_engine_bench [rounds=3] [mi_elements=64] [threads=2]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "engine/model/param_init.h"

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const int64_t n = (argc > 2 ? std::atoll(argv[2]) : 64) << 20;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  at::set_num_threads(1);  // as in training: one intra-op thread per rank
  at::Tensor serial = at::zeros({n}), threaded = at::zeros({n});  // touched before timing
  double sum[2] = {0, 0};
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int side = (r + k) % 2;  // alternate which goes first
      auto g = at::detail::createCPUGenerator(1234);
      at::Tensor& out = side == 0 ? serial : threaded;
      const auto t0 = std::chrono::steady_clock::now();
      dtrain::engine::model::normal_range(out, n, 0, 0.0, 0.02, g, side == 0 ? 1 : threads);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      sum[side] += s;
      std::printf("round %d %-8s %d thread(s): %.3f s, %.2f ns/element\n", r + 1, side == 0 ? "serial" : "threaded",
                  side == 0 ? 1 : threads, s, s / double(n) * 1e9);
    }
  }
  const double diff = (serial - threaded).abs().max().item<double>();
  std::printf("%lld elements: serial %.3f s, %d threads %.3f s (mean of %d): %.2fx; max |difference| %g\n",
              static_cast<long long>(n), sum[0] / rounds, threads, sum[1] / rounds, rounds, sum[0] / sum[1], diff);
  return diff == 0.0 ? 0 : 1;
}
