// run_attention_bench (attention_bench.h). The peak is the counting
// allocator's over one forward + backward minus the bytes alive before it
// (q, k, v and the upstream gradient), so it is what the core itself adds.
#include "engine/model/attention_bench.h"

#include <ATen/ops/randn.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "engine/device/counting_allocator.h"
#include "engine/model/attention_core.h"

namespace dtrain::engine::model {

int run_attention_bench(const AttentionBenchOptions& o) {
  device::install_counting_cpu_allocator();
  const AttentionKind kind = attention_kind(o.kind);
  auto gen = at::detail::createCPUGenerator(1);
  const int64_t BH = o.batch * o.heads;
  at::Tensor q = at::randn({BH, o.seq, o.head_dim}, gen).requires_grad_(true);  // [BH, T, D]
  at::Tensor k = at::randn({BH, o.seq, o.head_dim}, gen).requires_grad_(true);
  at::Tensor v = at::randn({BH, o.seq, o.head_dim}, gen).requires_grad_(true);
  const at::Tensor dout = at::randn({BH, o.seq, o.head_dim}, gen);
  AttentionDropout drop;
  drop.p = o.dropout;
  drop.global_rows = o.batch;
  drop.heads_global = o.heads;
  at::Tensor bias;
  double best_s = 1e30, total_s = 0;
  int64_t peak = 0;
  for (int it = 0; it <= o.iters; ++it) {
    const int64_t before = device::cpu_live_bytes();
    device::reset_cpu_peak();
    const auto t0 = std::chrono::steady_clock::now();
    {
      at::Tensor out = attention_core(kind, q, k, v, o.batch, drop, &bias);
      torch::autograd::grad({out}, {q, k, v}, {dout});
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    peak = std::max(peak, device::cpu_peak_bytes() - before);
    if (it == 0) continue;  // warm-up (the causal bias is built here)
    best_s = std::min(best_s, s);
    total_s += s;
  }
  std::printf("kind=%s seq=%lld batch=%lld heads=%lld head_dim=%lld dropout=%g iters=%d best_s=%.6f mean_s=%.6f "
              "peak_bytes=%lld\n",
              o.kind.c_str(), (long long)o.seq, (long long)o.batch, (long long)o.heads, (long long)o.head_dim,
              o.dropout, o.iters, best_s, total_s / std::max(o.iters, 1), (long long)peak);
  return 0;
}

}  // namespace dtrain::engine::model
