// AdamW's step on the quickstart GPT's parameters (4 x 128, 0.87M, 50
// tensors): the fused pass against the five ATen ops per tensor, interleaved
// rounds, CPU time of this thread (time-slicing by other processes does not
// count), one intra-op thread as in training. Prints ms per step of each and
// the ratio, and the largest difference between the two paths' parameters.
//   build/bench/adamw_engine_bench [rounds=5] [steps=50]
#include <time.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/optim/adamw.h"

namespace {

double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// engine/model/gpt.cpp's parameter shapes for vocab V, layers L, d_model C, seq T.
std::vector<std::vector<int64_t>> gpt_shapes(int64_t V, int64_t L, int64_t C, int64_t T) {
  std::vector<std::vector<int64_t>> s = {{V, C}, {T, C}};
  for (int64_t l = 0; l < L; ++l) {
    for (auto v : std::vector<std::vector<int64_t>>{{C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C}, {C}, {C},
                                                    {4 * C, C}, {4 * C}, {C, 4 * C}, {C}})
      s.push_back(v);
  }
  s.push_back({C});
  s.push_back({C});
  s.push_back({V, C});
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 50;
  at::set_num_threads(1);
  auto shapes = gpt_shapes(256, 4, 128, 64);
  std::vector<at::Tensor> pf, pa, gf, ga;
  std::vector<bool> decay;
  int64_t n = 0;
  for (auto& s : shapes) {
    pf.push_back(at::randn(s));
    pa.push_back(pf.back().clone());
    gf.push_back(at::randn(s));
    ga.push_back(gf.back().clone());
    decay.push_back(s.size() >= 2);
    n += pf.back().numel();
  }
  dtrain::engine::optim::AdamWOptions fo, ao;
  ao.fused = false;
  dtrain::engine::optim::AdamW fused(pf, decay, fo, gf), aten(pa, decay, ao, ga);
  std::vector<double> tf, ta;
  for (int r = 0; r < rounds; ++r) {
    double t0 = cpu_s();
    for (int i = 0; i < steps; ++i) fused.step(1e-3);
    double t1 = cpu_s();
    for (int i = 0; i < steps; ++i) aten.step(1e-3);
    double t2 = cpu_s();
    tf.push_back((t1 - t0) / steps * 1e3);
    ta.push_back((t2 - t1) / steps * 1e3);
    std::printf("round %d: fused %.3f ms/step, ATen ops %.3f ms/step, ratio %.2f\n", r + 1, tf.back(),
                ta.back(), ta.back() / tf.back());
  }
  std::sort(tf.begin(), tf.end());
  std::sort(ta.begin(), ta.end());
  double diff = 0;
  for (size_t i = 0; i < pf.size(); ++i) diff = std::max(diff, (pf[i] - pa[i]).abs().max().item<double>());
  std::printf("AdamW step over %zu tensors, %lld parameters: median fused %.3f ms, ATen ops %.3f ms "
              "(%.2fx); max |param diff| after %d steps %.3g\n",
              pf.size(), static_cast<long long>(n), tf[tf.size() / 2], ta[ta.size() / 2],
              ta[ta.size() / 2] / tf[tf.size() / 2], rounds * steps, diff);
  return 0;
}
