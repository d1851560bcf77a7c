// Cephes' expf for v <= 0 (Cody-Waite reduction by ln 2 in two parts, a
// degree-5 polynomial, 2^n by the exponent bits), at 8 lanes (AVX2 + FMA),
// 16 (AVX-512) and one (the same operations with std::fma and
// std::nearbyint, so every width gives the same bits). Arguments below
// kExpMin give 0, not a subnormal. Shared by the GELU and softmax kernels
// (gelu_kernel.cpp, softmax_kernel.cpp); internal to engine/model.
#pragma once

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps, which it then
// reports as (maybe) uninitialized (GCC bug 105593); nothing here reads one.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#define DTRAIN_AVX512 __attribute__((target("avx512f,avx512dq")))

namespace dtrain::engine::model::kernels::vec {

constexpr float kExpMin = -87.3f;  // exp(-87.3) ~ 1.2e-38, the last normal result

// exp(v) for v <= 0: 0 below kExpMin (the result would be a subnormal;
// the argument is clamped there, so 2^n stays a normal number).
__attribute__((target("avx2,fma"))) inline __m256 exp_nonpositive(__m256 v) {
  const __m256 keep = _mm256_cmp_ps(v, _mm256_set1_ps(kExpMin), _CMP_GE_OQ);
  v = _mm256_max_ps(v, _mm256_set1_ps(kExpMin));
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
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(pow2n)), keep);
}

// exp_nonpositive at 16 lanes: the same operations, lane by lane.
DTRAIN_AVX512 inline __m512 exp_nonpositive16(__m512 v) {
  const __mmask16 keep = _mm512_cmp_ps_mask(v, _mm512_set1_ps(kExpMin), _CMP_GE_OQ);
  v = _mm512_max_ps(v, _mm512_set1_ps(kExpMin));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), v);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i pow2n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(keep, _mm512_mul_ps(y, _mm512_castsi512_ps(pow2n)));
}

// exp_nonpositive for one float: the vector forms' operations in their
// order (fnmadd(a, b, c) = fma(-a, b, c); rounding to nearest even).
inline float exp_nonpositive_scalar(float v) {
  if (!(v >= kExpMin)) return 0.0f;
  const float n = std::nearbyint(v * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, v);
  r = std::fma(-n, -2.12194440e-4f, r);
  float y = 1.9875691500e-4f;
  y = std::fma(y, r, 1.3981999507e-3f);
  y = std::fma(y, r, 8.3334519073e-3f);
  y = std::fma(y, r, 4.1665795894e-2f);
  y = std::fma(y, r, 1.6666665459e-1f);
  y = std::fma(y, r, 5.0000001201e-1f);
  y = std::fma(y, r * r, r + 1.0f);
  const int32_t bits = (int32_t(n) + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof pow2n);
  return y * pow2n;
}

}  // namespace dtrain::engine::model::kernels::vec
