// fused_kernels.h's causal softmax: per row, only the columns on and below
// the diagonal are read (the causal mask is the row's length, not an
// additive -inf bias), and the rest of the row is written 0. Blocks of 16
// columns run at AVX-512 (one register) or AVX2 + FMA (two registers, lanes
// 0-7 and 8-15), the last partial block through masked loads into the same
// lanes, or by scalar code (std::fma, the vector exp's operations) on CPUs
// without AVX2; the lanes' sums fold in a fixed order (fold16). Each lane
// sees the same operations in the same order at every width, so every
// width gives the same bits.
// A row with a NaN, or +inf, among its scores comes out NaN (as ATen's).
#include "engine/model/fused_kernels.h"
#include "engine/model/vec_exp.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dtrain::engine::model::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The 16 lanes' sum: lane l + lane l + 8, then + 4, + 2, + 1.
float fold16(const float* lane) {
  float a[8];
  for (int l = 0; l < 8; ++l) a[l] = lane[l] + lane[l + 8];
  for (int l = 0; l < 4; ++l) a[l] = a[l] + a[l + 4];
  for (int l = 0; l < 2; ++l) a[l] = a[l] + a[l + 2];
  return a[0] + a[1];
}

// The vector loops take a row's first n columns: whole 16-column blocks,
// then the last partial block through masked loads (lanes past n read as
// -inf for the max and 0 elsewhere, and add nothing), so each column j
// lands in lane j % 16 at every width.
inline __mmask16 tail_mask16(int64_t rem) { return __mmask16((1u << rem) - 1u); }

// AVX2's two 8-lane halves of a 16-column tail block: lanes < rem set.
__attribute__((target("avx2,fma"))) inline void tail_masks8(int64_t rem, __m256i& lo, __m256i& hi) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(rem)), idx);
  hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(rem) - 8), idx);
}

// The max of s[0, n) (-inf when n is 0), and whether a NaN was seen.
DTRAIN_AVX512 float max_avx512(const float* s, int64_t n, bool& nan) {
  const __m512 ninf = _mm512_set1_ps(-kInf);
  __m512 m = ninf;
  __mmask16 bad = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 v = j + 16 <= n ? _mm512_loadu_ps(s + j) : _mm512_mask_loadu_ps(ninf, tail_mask16(n - j), s + j);
    bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, v);
  }
  nan = bad != 0;
  float l[16];
  _mm512_storeu_ps(l, m);
  return *std::max_element(l, l + 16);
}

__attribute__((target("avx2,fma"))) float max_avx2(const float* s, int64_t n, bool& nan) {
  const __m256 ninf = _mm256_set1_ps(-kInf);
  __m256 m = ninf, bad = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    __m256 v0, v1;
    if (j + 16 <= n) {
      v0 = _mm256_loadu_ps(s + j), v1 = _mm256_loadu_ps(s + j + 8);
    } else {
      __m256i lo, hi;
      tail_masks8(n - j, lo, hi);
      v0 = _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j, lo), _mm256_castsi256_ps(lo));
      v1 = _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j + 8, hi), _mm256_castsi256_ps(hi));
    }
    bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_cmp_ps(v0, v0, _CMP_UNORD_Q), _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q)));
    m = _mm256_max_ps(m, _mm256_max_ps(v0, v1));
  }
  nan = _mm256_movemask_ps(bad) != 0;
  float l[8];
  _mm256_storeu_ps(l, m);
  return *std::max_element(l, l + 8);
}

// p = exp((s - m) * scale) over [0, n), lane sums into lane[16].
DTRAIN_AVX512 void exp_avx512(const float* s, float* p, int64_t n, float m, float scale, float* lane) {
  const __m512 mv = _mm512_set1_ps(m), sc = _mm512_set1_ps(scale);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = j + 16 <= n ? __mmask16(0xffff) : tail_mask16(n - j);
    const __m512 v = _mm512_maskz_loadu_ps(k, s + j);
    const __m512 e = _mm512_maskz_mov_ps(k, vec::exp_nonpositive16(_mm512_mul_ps(_mm512_sub_ps(v, mv), sc)));
    _mm512_mask_storeu_ps(p + j, k, e);
    acc = _mm512_add_ps(acc, e);
  }
  _mm512_storeu_ps(lane, acc);
}

__attribute__((target("avx2,fma"))) void exp_avx2(const float* s, float* p, int64_t n, float m, float scale,
                                                  float* lane) {
  const __m256 mv = _mm256_set1_ps(m), sc = _mm256_set1_ps(scale);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const __m256i all = _mm256_set1_epi32(-1);
  for (int64_t j = 0; j < n; j += 16) {
    __m256i k0 = all, k1 = all;
    if (j + 16 > n) tail_masks8(n - j, k0, k1);
    const __m256 v0 = _mm256_maskload_ps(s + j, k0), v1 = _mm256_maskload_ps(s + j + 8, k1);
    const __m256 e0 = _mm256_and_ps(vec::exp_nonpositive(_mm256_mul_ps(_mm256_sub_ps(v0, mv), sc)),
                                    _mm256_castsi256_ps(k0));
    const __m256 e1 = _mm256_and_ps(vec::exp_nonpositive(_mm256_mul_ps(_mm256_sub_ps(v1, mv), sc)),
                                    _mm256_castsi256_ps(k1));
    _mm256_maskstore_ps(p + j, k0, e0);
    _mm256_maskstore_ps(p + j + 8, k1, e1);
    lo = _mm256_add_ps(lo, e0);
    hi = _mm256_add_ps(hi, e1);
  }
  _mm256_storeu_ps(lane, lo);
  _mm256_storeu_ps(lane + 8, hi);
}

// Backward: lane sums of p * dp (fused multiply-add) over [0, n).
DTRAIN_AVX512 void dot_avx512(const float* p, const float* dp, int64_t n, float* lane) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = j + 16 <= n ? __mmask16(0xffff) : tail_mask16(n - j);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, p + j), _mm512_maskz_loadu_ps(k, dp + j), acc);
  }
  _mm512_storeu_ps(lane, acc);
}

__attribute__((target("avx2,fma"))) void dot_avx2(const float* p, const float* dp, int64_t n, float* lane) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const __m256i all = _mm256_set1_epi32(-1);
  for (int64_t j = 0; j < n; j += 16) {
    __m256i k0 = all, k1 = all;
    if (j + 16 > n) tail_masks8(n - j, k0, k1);
    lo = _mm256_fmadd_ps(_mm256_maskload_ps(p + j, k0), _mm256_maskload_ps(dp + j, k0), lo);
    hi = _mm256_fmadd_ps(_mm256_maskload_ps(p + j + 8, k1), _mm256_maskload_ps(dp + j + 8, k1), hi);
  }
  _mm256_storeu_ps(lane, lo);
  _mm256_storeu_ps(lane + 8, hi);
}

// x[j] = a[j] * c (forward: c = 1 / sum) or a[j] * (b[j] - c) (backward)
// for j < n; the scalar tail does the same per element.
DTRAIN_AVX512 int64_t scale_avx512(const float* a, const float* b, float c, float* x, int64_t n) {
  const __m512 cv = _mm512_set1_ps(c);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 av = _mm512_loadu_ps(a + j);
    _mm512_storeu_ps(x + j, b ? _mm512_mul_ps(av, _mm512_sub_ps(_mm512_loadu_ps(b + j), cv)) : _mm512_mul_ps(av, cv));
  }
  return j;
}

__attribute__((target("avx2,fma"))) int64_t scale_avx2(const float* a, const float* b, float c, float* x,
                                                      int64_t n) {
  const __m256 cv = _mm256_set1_ps(c);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 av = _mm256_loadu_ps(a + j);
    _mm256_storeu_ps(x + j, b ? _mm256_mul_ps(av, _mm256_sub_ps(_mm256_loadu_ps(b + j), cv)) : _mm256_mul_ps(av, cv));
  }
  return j;
}

int64_t scale_vec(const float* a, const float* b, float c, float* x, int64_t n, VecIsa isa) {
  if (isa == VecIsa::avx512) return scale_avx512(a, b, c, x, n);
  if (isa == VecIsa::avx2) return scale_avx2(a, b, c, x, n);
  return 0;
}

// The width a call runs at: `isa`, or the next narrower one this CPU has.
VecIsa usable(VecIsa isa) {
  if (isa == VecIsa::avx512 && !isa_available(VecIsa::avx512)) isa = VecIsa::avx2;
  if (isa == VecIsa::avx2 && !isa_available(VecIsa::avx2)) isa = VecIsa::scalar;
  return isa;
}

void forward_row(const float* s, float* p, int64_t n, int64_t T, float scale, VecIsa isa) {
  bool nan = false;
  float m = -kInf;
  if (isa == VecIsa::avx512) {
    m = max_avx512(s, n, nan);
  } else if (isa == VecIsa::avx2) {
    m = max_avx2(s, n, nan);
  } else {
    for (int64_t j = 0; j < n; ++j) nan = nan || std::isnan(s[j]), m = std::max(m, s[j]);
  }
  if (nan || m == kInf) {
    std::fill(p, p + n, std::numeric_limits<float>::quiet_NaN());
    std::fill(p + n, p + T, 0.0f);
    return;
  }
  float lane[16] = {};
  if (isa == VecIsa::avx512) {
    exp_avx512(s, p, n, m, scale, lane);
  } else if (isa == VecIsa::avx2) {
    exp_avx2(s, p, n, m, scale, lane);
  } else {
    for (int64_t j = 0; j < n; ++j) lane[j % 16] += p[j] = vec::exp_nonpositive_scalar((s[j] - m) * scale);
  }
  const float inv = 1.0f / fold16(lane);  // >= 1 / n: the max's own term is 1
  for (int64_t j = scale_vec(p, nullptr, inv, p, n, isa); j < n; ++j) p[j] = p[j] * inv;
  std::fill(p + n, p + T, 0.0f);
}

void backward_row(const float* dp, const float* p, float* ds, int64_t n, int64_t T, VecIsa isa) {
  float lane[16] = {};
  if (isa == VecIsa::avx512) {
    dot_avx512(p, dp, n, lane);
  } else if (isa == VecIsa::avx2) {
    dot_avx2(p, dp, n, lane);
  } else {
    for (int64_t j = 0; j < n; ++j) lane[j % 16] = std::fma(p[j], dp[j], lane[j % 16]);
  }
  const float dot = fold16(lane);
  for (int64_t j = scale_vec(p, dp, dot, ds, n, isa); j < n; ++j) ds[j] = p[j] * (dp[j] - dot);
  std::fill(ds + n, ds + T, 0.0f);
}

}  // namespace

void causal_softmax_forward(const float* s, float* p, int64_t R, int64_t T, float scale, VecIsa isa) {
  isa = usable(isa);
  for (int64_t r = 0; r < R; ++r) forward_row(s + r * T, p + r * T, r % T + 1, T, scale, isa);
}

void causal_softmax_backward(const float* dp, const float* p, float* ds, int64_t R, int64_t T, VecIsa isa) {
  isa = usable(isa);
  for (int64_t r = 0; r < R; ++r) backward_row(dp + r * T, p + r * T, ds + r * T, r % T + 1, T, isa);
}

}  // namespace dtrain::engine::model::kernels
