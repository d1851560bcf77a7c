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
  // Four quarters read side by side: one read stream leaves the memory
  // system idle between misses (1.7x slower on a 51 MB gradient).
  const int64_t q = (n / 32) * 8;  // elements per quarter, a multiple of 8
  double acc[4][8] = {};
  for (int64_t i = 0; i < q; i += 8)
    for (int s = 0; s < 4; ++s)
      for (int j = 0; j < 8; ++j) acc[s][j] += double(p[s * q + i + j]) * double(p[s * q + i + j]);
  for (int64_t i = 4 * q; i < n; ++i) acc[0][0] += double(p[i]) * double(p[i]);
  double part[4];
  for (int s = 0; s < 4; ++s) {
    const double* a = acc[s];
    part[s] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  }
  return (part[0] + part[1]) + (part[2] + part[3]);
}

}  // namespace dtrain::engine::optim::kernel
