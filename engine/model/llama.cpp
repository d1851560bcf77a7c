// llama.h: RMSNorm, rotary embeddings and SwiGLU, written as the plain ATen
// compositions of transformers' Llama so that imported weights compute the
// same function.
#include "engine/model/llama.h"

#include <ATen/ATen.h>

#include <cmath>

namespace dtrain::engine::model {

RmsNormImpl::RmsNormImpl(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RmsNormImpl::forward(const at::Tensor& x) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);  // [..., C] fp32
  return weight * normed.to(x.scalar_type());
}

at::Tensor rotary_inv_freq(const RotaryConfig& cfg, int64_t head_dim) {
  // 1 / base^(arange(0, D, 2) / D) in fp32, as transformers computes it.
  const at::Tensor exponent = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / double(head_dim);
  at::Tensor inv = 1.0 / at::pow(cfg.theta, exponent);  // [D/2]
  if (!(cfg.factor > 0)) return inv;
  const double old_len = cfg.original_max_position;
  const double low_wavelen = old_len / cfg.low_freq_factor, high_wavelen = old_len / cfg.high_freq_factor;
  const at::Tensor wavelen = 2 * M_PI / inv;
  // Long wavelengths (low frequencies) divided by factor, short ones kept,
  // the band between interpolated smoothly.
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv / cfg.factor, inv);
  const at::Tensor smooth = (old_len / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / cfg.factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

std::vector<at::Tensor> rotary_cos_sin(const RotaryConfig& cfg, int64_t head_dim, const at::Tensor& positions) {
  const at::Tensor inv = rotary_inv_freq(cfg, head_dim).to(positions.device());  // [D/2]
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(1) * inv.unsqueeze(0);  // [T, D/2]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);                                 // [T, D]
  return {emb.cos(), emb.sin()};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t T = x.size(1), D = x.size(3), half = D / 2;
  const at::Tensor c = cos.to(x.scalar_type()).view({1, T, 1, D}), s = sin.to(x.scalar_type()).view({1, T, 1, D});
  const at::Tensor rotated = at::cat({-x.narrow(3, half, half), x.narrow(3, 0, half)}, 3);  // [B, T, n, D]
  return x * c + rotated * s;
}

const std::vector<at::Tensor>& Rotary::cos_sin(const at::Tensor& positions) {
  if (cached_.empty() || cached_[0].size(0) != positions.size(0) || cached_[0].device() != positions.device())
    cached_ = rotary_cos_sin(cfg, head_dim, positions);
  return cached_;
}

at::Tensor swiglu(const at::Tensor& gate_up) {
  const int64_t F = gate_up.size(-1) / 2;
  return at::silu(gate_up.narrow(-1, 0, F)) * gate_up.narrow(-1, F, F);
}

}  // namespace dtrain::engine::model
