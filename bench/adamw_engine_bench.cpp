// AdamW's step on a GPT's parameters, four ways, interleaved rounds (the
// order rotates each round), CPU time of this thread (time-slicing by other
// processes does not count), one intra-op thread as in training:
//   flat     params, grads and moments each one flat buffer (a ZeRO shard):
//            one vectorised loop per decay run (flat_runs, the default)
//   tensors  separate tensors (DDP's params): the same loop once per tensor
//   scalar   separate tensors, flat_runs false: the per-tensor scalar pass
//   aten     the five ATen ops per tensor (fused false)
// Prints ms per step of each, ratios to `scalar`, and the largest parameter
// difference of each against `scalar` (same bits expected but for aten).
//   build/bench/adamw_engine_bench [rounds=5] [steps=50] [d_model=128] [layers=4] [seq=64] [vocab=256]
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

struct Variant {
  const char* name;
  std::vector<at::Tensor> p, g;
  std::unique_ptr<dtrain::engine::optim::AdamW> opt;
  std::vector<double> ms;
};

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int def) { return argc > i ? std::atoi(argv[i]) : def; };
  const int rounds = arg(1, 5), steps = arg(2, 50);
  at::set_num_threads(1);
  auto shapes = gpt_shapes(arg(6, 256), arg(4, 4), arg(3, 128), arg(5, 64));
  std::vector<bool> decay;
  int64_t n = 0;
  for (auto& s : shapes) {
    decay.push_back(s.size() >= 2);
    n += c10::multiply_integers(s);
  }
  at::Tensor p0 = at::randn({n}), g0 = at::randn({n});
  std::vector<Variant> vs(4);
  vs[0].name = "flat", vs[1].name = "tensors", vs[2].name = "scalar", vs[3].name = "aten";
  for (size_t k = 0; k < vs.size(); ++k) {
    at::Tensor pf = p0.clone(), gf = g0.clone();  // one buffer; split below unless flat
    int64_t offset = 0;
    for (auto& s : shapes) {
      const int64_t len = c10::multiply_integers(s);
      at::Tensor pv = pf.narrow(0, offset, len).view(s), gv = gf.narrow(0, offset, len).view(s);
      vs[k].p.push_back(k == 0 ? pv : pv.clone());
      vs[k].g.push_back(k == 0 ? gv : gv.clone());
      offset += len;
    }
    dtrain::engine::optim::AdamWOptions o;
    o.flat_runs = k < 2;
    o.fused = k < 3;
    vs[k].opt = std::make_unique<dtrain::engine::optim::AdamW>(vs[k].p, decay, o, vs[k].g);
  }
  for (int r = 0; r < rounds; ++r) {
    std::printf("round %d:", r + 1);
    for (size_t j = 0; j < vs.size(); ++j) {
      Variant& v = vs[(j + size_t(r)) % vs.size()];
      const double t0 = cpu_s();
      for (int i = 0; i < steps; ++i) v.opt->step(1e-3);
      v.ms.push_back((cpu_s() - t0) / steps * 1e3);
      std::printf(" %s %.3f", v.name, v.ms.back());
    }
    std::printf(" ms/step\n");
  }
  auto median = [](std::vector<double> x) { std::sort(x.begin(), x.end()); return x[x.size() / 2]; };
  const double scalar = median(vs[2].ms);
  std::printf("AdamW step over %zu tensors, %lld parameters, median of %d rounds x %d steps:\n", shapes.size(),
              static_cast<long long>(n), rounds, steps);
  for (auto& v : vs) {
    double diff = 0;
    for (size_t i = 0; i < v.p.size(); ++i) diff = std::max(diff, (v.p[i] - vs[2].p[i]).abs().max().item<double>());
    std::printf("  %-8s %8.3f ms/step  scalar/this %.2fx  loops/step %3d  max |param - scalar's| %.3g\n", v.name,
                median(v.ms), scalar / median(v.ms), v.opt->last_step_loops(), diff);
  }
  return 0;
}
