// probe_matmul_gflops (matmul_probe.h).
#include "engine/device/matmul_probe.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <chrono>

namespace dtrain::engine::device {

double probe_matmul_gflops(int n, double seconds) {
  at::set_num_threads(1);
  auto gen = at::detail::createCPUGenerator(3);
  const at::Tensor a = at::randn({n, n}, gen), b = at::randn({n, n}, gen);
  at::Tensor c = at::mm(a, b);  // warm-up
  double best = 1e30, spent = 0;
  while (spent < seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    spent += s;
  }
  return 2.0 * n * n * double(n) / best / 1e9;
}

}  // namespace dtrain::engine::device
