// The pieces a Llama adds to the GPT of gpt.h (model.kind llama): RMSNorm,
// rotary position embeddings (Hugging Face's rotate_half convention, with
// Llama 3.1's frequency scaling) and the SwiGLU activation. The Llama
// itself is GptImpl with GptConfig::kind "llama"; this file owns only the
// numerics, not the wiring or any parallel layout.
//
// Shape legend: B = batch, T = time, n = heads, D = head dim, C = channels.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <vector>

namespace dtrain::engine::model {

// x * rsqrt(mean(x^2) + eps) * weight over the last dim, computed in fp32
// and returned in x's dtype before the weight (as transformers' LlamaRMSNorm).
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);  // [..., C] -> [..., C]
  at::Tensor weight;                        // [C], initialised to 1
  double eps;
};
TORCH_MODULE(RmsNorm);

struct RotaryConfig {
  double theta = 10000;
  double factor = 0;  // Llama 3.1 scaling; 0 = none
  double low_freq_factor = 1, high_freq_factor = 4;
  int original_max_position = 8192;
};

// inv_freq [D/2] fp32: 1 / theta^(2j/D), then Llama 3.1's scaling when
// factor > 0 (transformers' _compute_llama3_parameters, in fp32 as there).
at::Tensor rotary_inv_freq(const RotaryConfig& cfg, int64_t head_dim);

// cos and sin [T, D] (fp32) at the given positions [T] (int64, global).
std::vector<at::Tensor> rotary_cos_sin(const RotaryConfig& cfg, int64_t head_dim, const at::Tensor& positions);

// x [B, T, n, D] rotated at its positions: x cos + rotate_half(x) sin, with
// cos, sin [T, D] cast to x's dtype; rotate_half(x) = [-x2, x1] on the halves.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The blocks' shared cos/sin for the positions they see, computed once per
// (length, dtype, device) and reused until clear() (a new sequence split).
struct Rotary {
  RotaryConfig cfg;
  int64_t head_dim = 0;
  // positions: [T] int64 (global); T and options key the cache.
  const std::vector<at::Tensor>& cos_sin(const at::Tensor& positions);
  void clear() { cached_.clear(); }

 private:
  std::vector<at::Tensor> cached_;  // cos, sin [T, D] fp32 on the positions' device
};

// silu(gate) * up of a fused [..., 2F] = [gate | up] -> [..., F].
at::Tensor swiglu(const at::Tensor& gate_up);

}  // namespace dtrain::engine::model
