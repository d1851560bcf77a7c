// adamw_kernel.h: the loops, each compiled twice (target_clones "avx2", which
// tests the CPU feature, and the baseline). "avx2" brings no FMA, so the
// vector loop keeps the scalar pass's roundings: the same bits, 8 floats at
// a time. Built with -fno-math-errno (engine/CMakeLists.txt): a sqrt that
// may set errno does not vectorise.
#include "engine/optim/adamw_kernel.h"

#include <cmath>

#include "common/ab_switch.h"

namespace dtrain::engine::optim::kernel {

namespace {

// Element i's update: the per-tensor pass's operations in its order.
inline void adamw_one(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                      int64_t i, const AdamWScalars& c) {
  const float gi = g[i] * c.grad_scale;
  const float pi = p[i] * c.decay;
  const float mi = m[i] * c.b1 + c.one_minus_b1 * gi;
  const float vi = v[i] * c.b2 + c.one_minus_b2 * gi * gi;
  const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
  m[i] = mi;
  v[i] = vi;
  p[i] = pi + c.neg_step * (mi / denom);
}

// How far ahead (elements) the loop asks for its four streams' lines: the
// hardware prefetcher alone leaves one core's memory bandwidth short on
// seven streams (adamw_engine_bench at the compute-bound size, 12.9M
// parameters, Emerald Rapids: 21.0 -> 18.7 ms per update; 256 to 1024
// elements ahead did about as well in a plain loop, 4096 less).
constexpr int64_t kAhead = 512;

// DTRAIN_ADAMW_PREFETCH=0: the loop without the prefetches (for A/B runs).
bool prefetch_on() {
  static const bool on = !switched_off("DTRAIN_ADAMW_PREFETCH");
  return on;
}

}  // namespace

__attribute__((target_clones("avx2", "default")))
void adamw_run(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
               int64_t n, const AdamWScalars& s) {
  const AdamWScalars c = s;  // by value: the compiler need not reload it past the stores
  int64_t i = 0;
  if (!prefetch_on()) {
    for (; i < n; ++i) adamw_one(p, g, m, v, i, c);
    return;
  }
  // 16 elements (one 64-byte line of each stream) per block, the lines
  // kAhead elements on asked for first; the last kAhead elements without.
  for (; i + kAhead + 16 <= n; i += 16) {
    __builtin_prefetch(g + i + kAhead, 0);
    __builtin_prefetch(p + i + kAhead, 1);
    __builtin_prefetch(m + i + kAhead, 1);
    __builtin_prefetch(v + i + kAhead, 1);
    for (int64_t j = i; j < i + 16; ++j) adamw_one(p, g, m, v, j, c);
  }
  for (; i < n; ++i) adamw_one(p, g, m, v, i, c);
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
