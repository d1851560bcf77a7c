// The gradient norm's sum of squares (engine/optim/adamw_kernel.h sq_sum,
// four quarters read side by side) against the single-stream loop it
// replaced (written out here: eight accumulators, one read stream), on a
// buffer of the compute-size GPT's parameter count, interleaved rounds, CPU
// time of this thread. Prints ms per pass of each and their ratio.
//   build/bench/sq_sum_engine_bench [rounds=7] [elements=12800000]
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/optim/adamw_kernel.h"

namespace {

double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

__attribute__((target_clones("avx2", "default"))) double one_stream(const float* p, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += double(p[i + j]) * double(p[i + j]);
  for (; i < n; ++i) acc[0] += double(p[i]) * double(p[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 12800000;
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[size_t(i)] = float((i * 2654435761ULL) % 1000) * 1e-3f - 0.5f;
  std::vector<double> t_one, t_four;
  double s_one = 0, s_four = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {  // the order alternates each round
      const bool four = (r + k) % 2 == 0;
      const double t0 = cpu_s();
      const double s = four ? dtrain::engine::optim::kernel::sq_sum(g.data(), n) : one_stream(g.data(), n);
      const double ms = 1e3 * (cpu_s() - t0);
      (four ? t_four : t_one).push_back(ms);
      (four ? s_four : s_one) = s;
    }
    std::printf("round %d: one stream %.2f ms, four quarters %.2f ms\n", r + 1, t_one.back(), t_four.back());
  }
  std::printf("elements %lld: median one stream %.2f ms, four quarters %.2f ms, four/one %.3f; sums %.10g %.10g (rel diff %.2g)\n",
              static_cast<long long>(n), median(t_one), median(t_four), median(t_four) / median(t_one), s_one, s_four,
              (s_four - s_one) / s_one);
  return 0;
}
