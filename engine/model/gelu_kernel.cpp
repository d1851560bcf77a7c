// fused_kernels.h's GELU: 16 floats at a time with AVX-512 (F + DQ) or 8
// with AVX2 + FMA intrinsics (picked at run time by the CPU's features,
// best_isa), the remainder and other CPUs by the scalar form of the same
// formula. The AVX-512 loop leaves a remainder of up to 15 to the AVX2 loop
// and then the scalar one, and runs the same operations in the same order
// per lane, so both widths give the same bits for every element. Per
// element, with z = |x| / sqrt 2:
//   t = 1 / (1 + p z), q = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e / 2,
//   e = exp(-z^2) (Cephes' expf: Cody-Waite reduction, degree-5 polynomial;
//     0 for z^2 > 87.3, where it would be a subnormal),
//   q = 0 where it would be below the smallest normal float,
//   Phi(x) = 1 - q for x >= 0, q for x < 0 (so 1 + erf(x / sqrt 2) = 2 Phi),
//   y = x Phi(x);  dx = dy (Phi(x) + x e / sqrt(2 pi)).
// The bias variants run that per row of [N, F] on h + b, and the backward's
// bias gradient sums each column in double, rows in order (the same bits
// at every width).
#include "engine/model/fused_kernels.h"

#include "engine/model/vec_exp.h"  // immintrin.h and the exp kernels

#include <cmath>
#include <cstdlib>
#include <string>

namespace dtrain::engine::model::kernels {
namespace {

using vec::exp_nonpositive;
using vec::exp_nonpositive16;
using vec::kExpMin;

constexpr float kP = 0.3275911f, kA1 = 0.254829592f, kA2 = -0.284496736f, kA3 = 1.421413741f,
                kA4 = -1.453152027f, kA5 = 1.061405429f;
constexpr float kSqrtHalf = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
// q below the smallest normal float is flushed to 0: exp's argument is
// clamped at -87.3, so for x < ~-13 q would be a subnormal (~1e-40), and
// GEMMs that read many subnormals (the next layer's, forward and dW) run
// several times slower. at::gelu returns 0 there too.
constexpr float kFltMin = 1.17549435e-38f;

// Phi(x) and e = exp(-x^2 / 2), scalar.
inline void phi_scalar(float x, float& phi, float& e) {
  const float z = std::fabs(x) * kSqrtHalf;
  const float t = 1.0f / (1.0f + kP * z);
  e = -z * z >= kExpMin ? std::exp(-z * z) : 0.0f;
  float q = 0.5f * t * (kA1 + t * (kA2 + t * (kA3 + t * (kA4 + t * kA5)))) * e;
  if (!(q >= kFltMin)) q = 0.0f;  // the far tail: 0, not a subnormal
  phi = x >= 0.0f ? 1.0f - q : q;
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
  __m256 q = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(poly, t), e), _mm256_set1_ps(0.5f));
  q = _mm256_and_ps(q, _mm256_cmp_ps(q, _mm256_set1_ps(kFltMin), _CMP_GE_OQ));  // the far tail: 0, not a subnormal
  phi = _mm256_blendv_ps(_mm256_sub_ps(one, q), q, x);  // the sign bit of x picks q
}

__attribute__((target("avx2,fma"))) int64_t gelu_forward_avx2(float* pre, const float* b, const float* in, float* y,
                                                             int64_t i, int64_t n) {
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(in + i);
    if (b) {
      v = _mm256_add_ps(v, _mm256_loadu_ps(b + i));
      _mm256_storeu_ps(pre + i, v);
    }
    __m256 phi, e;
    phi8(v, phi, e);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, phi));
  }
  return i;
}

__attribute__((target("avx2,fma"))) int64_t gelu_backward_avx2(const float* dy, const float* x, float* dx, double* db,
                                                              int64_t i, int64_t n) {
  const __m256 c = _mm256_set1_ps(kInvSqrt2Pi);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    __m256 phi, e;
    phi8(v, phi, e);
    const __m256 d = _mm256_mul_ps(_mm256_loadu_ps(dy + i), _mm256_fmadd_ps(_mm256_mul_ps(v, e), c, phi));
    _mm256_storeu_ps(dx + i, d);
    if (db) {
      _mm256_storeu_pd(db + i, _mm256_add_pd(_mm256_loadu_pd(db + i), _mm256_cvtps_pd(_mm256_castps256_ps128(d))));
      _mm256_storeu_pd(db + i + 4,
                       _mm256_add_pd(_mm256_loadu_pd(db + i + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(d, 1))));
    }
  }
  return i;
}

// phi8 at 16 lanes: the same operations, lane by lane.
DTRAIN_AVX512 inline void phi16(__m512 x, __m512& phi, __m512& e) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512 z = _mm512_mul_ps(_mm512_andnot_ps(sign, x), _mm512_set1_ps(kSqrtHalf));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(kP), z, one));
  __m512 poly = _mm512_fmadd_ps(_mm512_set1_ps(kA5), t, _mm512_set1_ps(kA4));
  poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(kA3));
  poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(kA2));
  poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(kA1));
  e = exp_nonpositive16(_mm512_xor_ps(sign, _mm512_mul_ps(z, z)));
  __m512 q = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(poly, t), e), _mm512_set1_ps(0.5f));
  q = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(q, _mm512_set1_ps(kFltMin), _CMP_GE_OQ), q);  // as phi8
  // the sign bit of x picks q (as blendv in phi8)
  phi = _mm512_mask_blend_ps(_mm512_movepi32_mask(_mm512_castps_si512(x)), _mm512_sub_ps(one, q), q);
}

// The loops below take [i, n) and return where they stopped (a multiple of
// their width from i). Forward: in -> y; b, when not null, is added to in
// first and the sum written to pre (the pre-activation the backward reads;
// pre may be in itself). Backward: db, when not null, accumulates dx.

DTRAIN_AVX512 int64_t gelu_forward_avx512(float* pre, const float* b, const float* in, float* y, int64_t i,
                                          int64_t n) {
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(in + i);
    if (b) {
      v = _mm512_add_ps(v, _mm512_loadu_ps(b + i));
      _mm512_storeu_ps(pre + i, v);
    }
    __m512 phi, e;
    phi16(v, phi, e);
    _mm512_storeu_ps(y + i, _mm512_mul_ps(v, phi));
  }
  return i;
}

DTRAIN_AVX512 int64_t gelu_backward_avx512(const float* dy, const float* x, float* dx, double* db, int64_t i,
                                           int64_t n) {
  const __m512 c = _mm512_set1_ps(kInvSqrt2Pi);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    __m512 phi, e;
    phi16(v, phi, e);
    const __m512 d = _mm512_mul_ps(_mm512_loadu_ps(dy + i), _mm512_fmadd_ps(_mm512_mul_ps(v, e), c, phi));
    _mm512_storeu_ps(dx + i, d);
    if (db) {
      _mm512_storeu_pd(db + i, _mm512_add_pd(_mm512_loadu_pd(db + i), _mm512_cvtps_pd(_mm512_castps512_ps256(d))));
      _mm512_storeu_pd(db + i + 8,
                       _mm512_add_pd(_mm512_loadu_pd(db + i + 8), _mm512_cvtps_pd(_mm512_extractf32x8_ps(d, 1))));
    }
  }
  return i;
}

bool cpu_has(VecIsa isa) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return isa == VecIsa::scalar || (isa == VecIsa::avx2 && avx2) || (isa == VecIsa::avx512 && avx512);
}

// One row (or all of a flat tensor): in (+ b, written to pre) -> y.
void gelu_forward_row(float* pre, const float* b, const float* in, float* y, int64_t n, VecIsa isa) {
  int64_t i = 0;
  if (isa == VecIsa::avx512 && cpu_has(VecIsa::avx512)) i = gelu_forward_avx512(pre, b, in, y, i, n);
  if (isa != VecIsa::scalar && cpu_has(VecIsa::avx2)) i = gelu_forward_avx2(pre, b, in, y, i, n);
  for (; i < n; ++i) {
    const float v = b ? (pre[i] = in[i] + b[i]) : in[i];
    float phi, e;
    phi_scalar(v, phi, e);
    y[i] = v * phi;
  }
}

void gelu_backward_row(const float* dy, const float* x, float* dx, double* db, int64_t n, VecIsa isa) {
  int64_t i = 0;
  if (isa == VecIsa::avx512 && cpu_has(VecIsa::avx512)) i = gelu_backward_avx512(dy, x, dx, db, i, n);
  if (isa != VecIsa::scalar && cpu_has(VecIsa::avx2)) i = gelu_backward_avx2(dy, x, dx, db, i, n);
  for (; i < n; ++i) {
    float phi, e;
    phi_scalar(x[i], phi, e);
    dx[i] = dy[i] * (phi + x[i] * e * kInvSqrt2Pi);
    if (db) db[i] += double(dx[i]);
  }
}

}  // namespace

VecIsa best_isa() {
  static const VecIsa best = [] {
    VecIsa b = cpu_has(VecIsa::avx512) ? VecIsa::avx512 : cpu_has(VecIsa::avx2) ? VecIsa::avx2 : VecIsa::scalar;
    const char* cap = std::getenv("DTRAIN_VEC_ISA");
    if (cap && std::string(cap) == "avx2" && b == VecIsa::avx512) b = VecIsa::avx2;
    if (cap && std::string(cap) == "scalar") b = VecIsa::scalar;
    return b;
  }();
  return best;
}

bool isa_available(VecIsa isa) { return cpu_has(isa); }

void gelu_forward(const float* x, float* y, int64_t n, VecIsa isa) {
  gelu_forward_row(nullptr, nullptr, x, y, n, isa);
}

void gelu_backward(const float* dy, const float* x, float* dx, int64_t n, VecIsa isa) {
  gelu_backward_row(dy, x, dx, nullptr, n, isa);
}

void bias_gelu_forward(float* h, const float* b, float* y, int64_t N, int64_t F, VecIsa isa) {
  for (int64_t r = 0; r < N; ++r) gelu_forward_row(h + r * F, b, h + r * F, y + r * F, F, isa);
}

void gelu_backward_bias(const float* dy, const float* pre, float* dpre, double* db, int64_t N, int64_t F,
                        VecIsa isa) {
  for (int64_t r = 0; r < N; ++r) gelu_backward_row(dy + r * F, pre + r * F, dpre + r * F, db, F, isa);
}

}  // namespace dtrain::engine::model::kernels
