// adamw_kernel.h: the loops, each compiled twice (target_clones "avx2", which
// tests the CPU feature, and the baseline). "avx2" brings no FMA, so the
// vector loop keeps the scalar pass's roundings: the same bits, 8 floats at
// a time. Built with -fno-math-errno (engine/CMakeLists.txt): a sqrt that
// may set errno does not vectorise.
#include "engine/optim/adamw_kernel.h"

#include <cmath>

namespace dtrain::engine::optim::kernel {

__attribute__((target_clones("avx2", "default")))
void adamw_run(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
               int64_t n, const AdamWScalars& s) {
  const AdamWScalars c = s;  // by value: the compiler need not reload it past the stores
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * c.grad_scale;
    const float pi = p[i] * c.decay;
    const float mi = m[i] * c.b1 + c.one_minus_b1 * gi;
    const float vi = v[i] * c.b2 + c.one_minus_b2 * gi * gi;
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + c.neg_step * (mi / denom);
  }
}

__attribute__((target_clones("avx2", "default")))
double sq_sum(const float* p, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += double(p[i + j]) * double(p[i + j]);
  for (; i < n; ++i) acc[0] += double(p[i]) * double(p[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace dtrain::engine::optim::kernel
