// The model's fused CPU operators (fused_kernels.h) as autograd functions:
// residual add + LayerNorm or RMSNorm, RMSNorm, SwiGLU's backward, GELU and
// a linear's bias + GELU, one pass where ATen's composition runs several. They compute the
// function of the ATen composition named beside each (to ~1e-7); for
// anything but contiguous-able fp32 CPU tensors they run that composition.
// Owns neither the modules (gpt.cpp, llama.h) nor when to fuse (GptConfig).
//
// Shape legend: C = channels, F = the SwiGLU hidden width.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace dtrain::engine::model {

// A norm's parameters: LayerNorm (rms false; bias defined) or RMSNorm (rms
// true; no bias), over the last dim.
struct NormParams {
  at::Tensor weight;  // [C]
  at::Tensor bias;    // [C] (LayerNorm) or undefined
  double eps = 1e-5;
  bool rms = false;
};

// norm(x): at::layer_norm(x, {C}, w, b, eps) (ATen's own: it is one pass
// already), or RMSNorm's w * (x * rsqrt(mean(x^2) + eps))
// (RmsNormImpl::forward) through the kernel.   x [..., C]
at::Tensor fused_norm(const at::Tensor& x, const NormParams& p);

// {h, norm(h)} with h = x + r: the residual add and the next norm in one
// pass over h (forward), and in backward h's two gradients summed inside
// the norm's.   x, r [..., C]
std::pair<at::Tensor, at::Tensor> fused_add_norm(const at::Tensor& x, const at::Tensor& r, const NormParams& p);

// silu(gate) * up of [..., 2F] = [gate | up] -> [..., F], as swiglu()
// (llama.h, which also runs the forward); its backward writes both halves'
// gradients into one [..., 2F] (the composition zero-fills two and adds them).
at::Tensor fused_swiglu(const at::Tensor& gate_up);

// at::gelu(x) (exact, erf) through the GELU kernel both ways: one exp per
// element in backward where ATen's gelu_backward runs erf's and a second.
// DTRAIN_FUSED_GELU=0 keeps at::gelu (A/B runs).   x [...]
at::Tensor fused_gelu(const at::Tensor& x);

// at::gelu(at::linear(x, w, b)) (a GPT's fc and its GELU) as one autograd
// node: the GEMM without the bias, then one pass adding the bias and
// applying the GELU kernel; backward, GELU's gradient and the bias's in one
// pass, then the linear's GEMMs with W's gradient into its slot
// (grad_slot.h). Falls back to fused_gelu of the linear (also under
// DTRAIN_FUSED_BIAS_GELU=0, for A/B runs).   x [..., K], w [F, K], b [F]
at::Tensor fused_linear_gelu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

}  // namespace dtrain::engine::model
