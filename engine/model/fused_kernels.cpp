// fused_kernels.h: the loops. Each is compiled twice (target_clones: AVX2
// and the baseline) and picked at load time by the CPU's features (not
// "arch=haswell", which tests the CPU model: an AMD Zen would get the
// baseline), so the inner loops vectorise at 8 floats where the machine
// allows. Reductions over a row accumulate in double (vectorised by `omp
// simd`, built with -fopenmp-simd: no OpenMP runtime), so they agree with
// ATen's fp32 passes to well under 1e-6 at model widths.
#include "engine/model/fused_kernels.h"

#include <algorithm>
#include <cmath>

namespace dtrain::engine::model::kernels {

#define DTRAIN_CLONES __attribute__((target_clones("avx2", "default")))

DTRAIN_CLONES
void norm_forward(const float* x, const float* r, const float* w, const float* b, float* h_out, float* y,
                  float* mean, float* rstd, int64_t N, int64_t C, float eps, bool rms) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float* yr = y + n * C;
    const float* h = xr;
    if (r) {  // h = x + r, written once and read back from cache below
      const float* rr = r + n * C;
      float* hr = h_out + n * C;
      for (int64_t c = 0; c < C; ++c) hr[c] = xr[c] + rr[c];
      h = hr;
    }
    double m = 0;
    if (!rms) {
#pragma omp simd reduction(+ : m)
      for (int64_t c = 0; c < C; ++c) m += h[c];
      m /= double(C);
    }
    double var = 0;
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < C; ++c) {
      const double d = double(h[c]) - m;
      var += d * d;
    }
    var /= double(C);
    const float mf = float(m), rs = float(1.0 / std::sqrt(var + double(eps)));
    mean[n] = mf;
    rstd[n] = rs;
    if (rms) {
      for (int64_t c = 0; c < C; ++c) yr[c] = w[c] * (h[c] * rs);
    } else {
      for (int64_t c = 0; c < C; ++c) yr[c] = (h[c] - mf) * rs * w[c] + b[c];
    }
  }
}

DTRAIN_CLONES
void norm_backward(const float* dy, const float* dh, const float* h, const float* w, const float* mean,
                   const float* rstd, float* dx, double* dw, double* db, int64_t N, int64_t C, bool rms) {
  for (int64_t n = 0; n < N; ++n) {
    const float* dyr = dy + n * C;
    const float* hr = h + n * C;
    float* dxr = dx + n * C;
    const float mf = rms ? 0.0f : mean[n], rs = rstd[n];
    // g = dy * w; a = mean(g) (LayerNorm only); bsum = mean(g * xhat)
    double a = 0, bsum = 0;
#pragma omp simd reduction(+ : a, bsum)
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (hr[c] - mf) * rs;
      const float g = dyr[c] * w[c];
      a += g;
      bsum += double(g) * xhat;
      dw[c] += double(dyr[c]) * xhat;
    }
    if (!rms)
      for (int64_t c = 0; c < C; ++c) db[c] += dyr[c];
    const float af = rms ? 0.0f : float(a / double(C)), bf = float(bsum / double(C));
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (hr[c] - mf) * rs;
      dxr[c] = rs * (dyr[c] * w[c] - af - xhat * bf) + (dh ? dh[n * C + c] : 0.0f);
    }
  }
}

DTRAIN_CLONES
void swiglu_backward(const float* dout, const float* gate_up, const float* sig, float* dgate_up, int64_t N,
                     int64_t F) {
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gate_up + n * 2 * F;
    const float* u = g + F;
    const float* d = dout + n * F;
    const float* sg = sig + n * F;
    float* dg = dgate_up + n * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float s = sg[f];
      const float silu = g[f] * s;
      du[f] = d[f] * silu;
      dg[f] = d[f] * u[f] * (s * (1.0f + g[f] * (1.0f - s)));  // silu'(g) = s (1 + g (1 - s))
    }
  }
}

}  // namespace dtrain::engine::model::kernels
