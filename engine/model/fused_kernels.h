// Fused CPU kernels of the model's memory-bound steps, as plain loops over
// contiguous fp32 rows: residual add + LayerNorm / RMSNorm (forward and
// backward in one pass over a row each), SwiGLU's backward, GELU and the
// causal softmax. No LibTorch here (fused_ops.cpp and attention_core.cpp
// wrap them and own the checks on dtype, device and layout); one thread,
// the caller's.
//
// Shape legend: N = rows (B*T), C = channels, F = the SwiGLU hidden width.
#pragma once

#include <cstdint>

namespace dtrain::engine::model::kernels {

// Per row: h = x + r (r null: h is x, not written), then
// LayerNorm (rms false) y = (h - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), or
// RMSNorm   (rms true)  y = (h * rstd) * w,            rstd = 1/sqrt(mean(h^2) + eps);
// mean and rstd [N] are kept for the backward (mean unused with rms).
// Row statistics accumulate in double. h_out may be null when r is null.
void norm_forward(const float* x, const float* r, const float* w, const float* b, float* h_out, float* y,
                  float* mean, float* rstd, int64_t N, int64_t C, float eps, bool rms);

// The gradient of the above: dy [N, C] (of y) and dh [N, C] (h's gradient
// from its other readers; null: none) -> dx [N, C] (also r's gradient);
// dw, db [C] are accumulated in double (db unused with rms).
void norm_backward(const float* dy, const float* dh, const float* h, const float* w, const float* mean,
                   const float* rstd, float* dx, double* dw, double* db, int64_t N, int64_t C, bool rms);

// The gradient of out [N, F] = silu(gate) * up, gate_up [N, 2F] = [gate | up]
// per row, given sig [N, F] = sigmoid(gate) (ATen's vectorised exp: a loop
// here over exp would be scalar): dout [N, F] -> dgate_up [N, 2F], both
// halves written, no zero-fill.
void swiglu_backward(const float* dout, const float* gate_up, const float* sig, float* dgate_up, int64_t N,
                     int64_t F);

// The vector width the GELU kernels run at: the widest this CPU has
// (best_isa; DTRAIN_VEC_ISA=avx2 or scalar caps it, for A/B runs), or one
// a caller names (tests compare them; a width the CPU lacks falls back to
// the next narrower one). Every width gives the same bits.
enum class VecIsa { scalar, avx2, avx512 };
VecIsa best_isa();
bool isa_available(VecIsa isa);

// Exact (erf) GELU as at::gelu: y = x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2,
// erf by Abramowitz & Stegun 7.1.26 (ATen's vectorised erf: |error| <= 1.5e-7)
// over [n] contiguous floats. The backward, dx = dy * (Phi(x) + x * phi(x)),
// shares one exp(-x^2 / 2) between erf and the density phi, where ATen's
// gelu_backward evaluates erf (with its exp) and a second exp. AVX-512 or
// AVX2 + FMA intrinsics where the CPU has them (gelu_kernel.cpp; plain
// loops over exp would not vectorise), else scalar.
void gelu_forward(const float* x, float* y, int64_t n, VecIsa isa = best_isa());
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n, VecIsa isa = best_isa());

// The same over rows with a bias, for a linear layer's output h [N, F]
// (x W^T without its bias) and its bias b [F]: h += b in place (h becomes
// the pre-activation the backward reads), y = gelu(h). Backward: dpre =
// dy * gelu'(pre) [N, F] and db [F] += the column sums of dpre (double,
// rows in order), in one pass.
void bias_gelu_forward(float* h, const float* b, float* y, int64_t N, int64_t F, VecIsa isa = best_isa());
void gelu_backward_bias(const float* dy, const float* pre, float* dpre, double* db, int64_t N, int64_t F,
                        VecIsa isa = best_isa());

// Causal softmax over the rows of scores s [R, T], row r being query
// position i = r % T (rows of [B, H, T, T]) and `scale` > 0 (1 / sqrt(D)):
// p[j] = exp((s[j] - m) scale) / sum for j <= i (m, sum over those), p[j] = 0
// for j > i; the scores above the diagonal are never read (they may be
// unset). Backward (of softmax(scale s) as a function of scale s): ds[j] =
// p[j] (dp[j] - sum_k p[k] dp[k]) for j <= i, 0 above (dp is not read
// there). Cephes' exp (vec_exp.h: 0 below -87.3, not a subnormal); sums
// in 16 float lanes (lane j % 16, columns in order) folded in a fixed order,
// so every width gives the same bits. p may be s; ds may be dp.
void causal_softmax_forward(const float* s, float* p, int64_t R, int64_t T, float scale, VecIsa isa = best_isa());
void causal_softmax_backward(const float* dp, const float* p, float* ds, int64_t R, int64_t T,
                             VecIsa isa = best_isa());

}  // namespace dtrain::engine::model::kernels
