// fused_kernels.h's GELU: 8 floats at a time with AVX2 + FMA intrinsics
// (picked at run time by the CPU's features), the remainder and other CPUs
// by the scalar form of the same formula. Per element, with z = |x| / sqrt 2:
//   t = 1 / (1 + p z), q = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e / 2,
//   e = exp(-z^2) (Cephes' expf: Cody-Waite reduction, degree-5 polynomial),
//   Phi(x) = 1 - q for x >= 0, q for x < 0 (so 1 + erf(x / sqrt 2) = 2 Phi),
//   y = x Phi(x);  dx = dy (Phi(x) + x e / sqrt(2 pi)).
#include "engine/model/fused_kernels.h"

#include <immintrin.h>

#include <cmath>

namespace dtrain::engine::model::kernels {
namespace {

constexpr float kP = 0.3275911f, kA1 = 0.254829592f, kA2 = -0.284496736f, kA3 = 1.421413741f,
                kA4 = -1.453152027f, kA5 = 1.061405429f;
constexpr float kSqrtHalf = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;

// Phi(x) and e = exp(-x^2 / 2), scalar.
inline void phi_scalar(float x, float& phi, float& e) {
  const float z = std::fabs(x) * kSqrtHalf;
  const float t = 1.0f / (1.0f + kP * z);
  e = std::exp(-z * z);
  const float q = 0.5f * t * (kA1 + t * (kA2 + t * (kA3 + t * (kA4 + t * kA5)))) * e;
  phi = x >= 0.0f ? 1.0f - q : q;
}

// exp(v) for v <= 0 (clamped at -87.3: below it the result underflows to
// ~1e-38, and 2^n stays a normal number).
__attribute__((target("avx2,fma"))) inline __m256 exp_nonpositive(__m256 v) {
  v = _mm256_max_ps(v, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), v);  // v - n ln2, in two parts
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n));
}

// Phi(x) and e for 8 floats.
__attribute__((target("avx2,fma"))) inline void phi8(__m256 x, __m256& phi, __m256& e) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 z = _mm256_mul_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(kSqrtHalf));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(kP), z, one));
  __m256 poly = _mm256_fmadd_ps(_mm256_set1_ps(kA5), t, _mm256_set1_ps(kA4));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(kA3));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(kA2));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(kA1));
  e = exp_nonpositive(_mm256_xor_ps(sign, _mm256_mul_ps(z, z)));
  const __m256 q = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(poly, t), e), _mm256_set1_ps(0.5f));
  phi = _mm256_blendv_ps(_mm256_sub_ps(one, q), q, x);  // the sign bit of x picks q
}

__attribute__((target("avx2,fma"))) int64_t gelu_forward_avx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    __m256 phi, e;
    phi8(v, phi, e);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, phi));
  }
  return i;
}

__attribute__((target("avx2,fma"))) int64_t gelu_backward_avx2(const float* dy, const float* x, float* dx,
                                                              int64_t n) {
  int64_t i = 0;
  const __m256 c = _mm256_set1_ps(kInvSqrt2Pi);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    __m256 phi, e;
    phi8(v, phi, e);
    const __m256 d = _mm256_fmadd_ps(_mm256_mul_ps(v, e), c, phi);
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(dy + i), d));
  }
  return i;
}

bool has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

}  // namespace

void gelu_forward(const float* x, float* y, int64_t n) {
  int64_t i = has_avx2_fma() ? gelu_forward_avx2(x, y, n) : 0;
  for (; i < n; ++i) {
    float phi, e;
    phi_scalar(x[i], phi, e);
    y[i] = x[i] * phi;
  }
}

void gelu_backward(const float* dy, const float* x, float* dx, int64_t n) {
  int64_t i = has_avx2_fma() ? gelu_backward_avx2(dy, x, dx, n) : 0;
  for (; i < n; ++i) {
    float phi, e;
    phi_scalar(x[i], phi, e);
    dx[i] = dy[i] * (phi + x[i] * e * kInvSqrt2Pi);
  }
}

}  // namespace dtrain::engine::model::kernels
