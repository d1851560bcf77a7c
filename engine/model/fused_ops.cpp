// fused_ops.h: the autograd functions around fused_kernels.h and the
// fallback to the ATen compositions they replace (non-fp32, non-CPU, or
// under autocast, whose casts the compositions' ops carry).
#include "engine/model/fused_ops.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <initializer_list>

#include "common/ab_switch.h"
#include "engine/model/fused_kernels.h"
#include "engine/model/grad_slot.h"
#include "engine/model/linear_ops.h"
#include "engine/model/llama.h"

namespace dtrain::engine::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Every defined tensor fp32 on the CPU, outside autocast.
bool fusable(std::initializer_list<const at::Tensor*> ts) {
  if (at::autocast::is_autocast_enabled(at::kCPU)) return false;
  for (const at::Tensor* t : ts)
    if (t->defined() && (!t->device().is_cpu() || t->scalar_type() != at::kFloat)) return false;
  return true;
}

// DTRAIN_FUSED_GELU=0: at::gelu (for A/B runs).
bool fused_gelu_off() {
  static const bool off = switched_off("DTRAIN_FUSED_GELU");
  return off;
}

// DTRAIN_FUSED_BIAS_GELU=0: the linear with its bias (addmm), then the
// GELU kernel as its own op (for A/B runs).
bool fused_bias_gelu_off() {
  static const bool off = switched_off("DTRAIN_FUSED_BIAS_GELU");
  return off;
}

// The compositions the kernels replace (the fallback, and what they match).
at::Tensor reference_norm(const at::Tensor& x, const NormParams& p) {
  if (!p.rms) return at::layer_norm(x, {x.size(-1)}, p.weight, p.bias, p.eps);
  const at::Tensor x32 = x.to(at::kFloat);  // RmsNormImpl::forward
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + p.eps);
  return p.weight * normed.to(x.scalar_type());
}

// Inputs x, r (empty: no residual), w, b (empty: rms); outputs {y} or,
// with r, {y, h}. Saves h (x without r), w and the row statistics. (Absent
// inputs are empty tensors, not undefined ones: autograd records every
// input's device.)
struct FusedNorm : public torch::autograd::Function<FusedNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& r_in, const at::Tensor& w,
                               const at::Tensor& b_in, double eps, bool rms) {
    const int64_t C = x.size(-1), N = x.numel() / C;
    const at::Tensor xc = x.contiguous(), wc = w.contiguous();
    const at::Tensor r = r_in.numel() > 0 ? r_in : at::Tensor(), b = b_in.numel() > 0 ? b_in : at::Tensor();
    const at::Tensor rc = r.defined() ? r.contiguous() : at::Tensor();
    const at::Tensor bc = b.defined() ? b.contiguous() : at::Tensor();
    at::Tensor y = at::empty_like(xc);                          // [..., C]
    at::Tensor h = r.defined() ? at::empty_like(xc) : xc;       // [..., C]
    at::Tensor mean = at::empty({N}, xc.options()), rstd = at::empty({N}, xc.options());  // [N]
    kernels::norm_forward(xc.const_data_ptr<float>(), r.defined() ? rc.const_data_ptr<float>() : nullptr,
                          wc.const_data_ptr<float>(), bc.defined() ? bc.const_data_ptr<float>() : nullptr,
                          r.defined() ? h.mutable_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>(),
                          mean.mutable_data_ptr<float>(), rstd.mutable_data_ptr<float>(), N, C, float(eps), rms);
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["residual"] = r.defined();
    ctx->saved_data["bias"] = b.defined();
    ctx->save_for_backward({h, wc, mean, rstd});
    if (!r.defined()) return {y};
    return {y, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
    const bool rms = ctx->saved_data["rms"].toBool(), residual = ctx->saved_data["residual"].toBool();
    const int64_t C = h.size(-1), N = h.numel() / C;
    const at::Tensor dy = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(h);
    const at::Tensor dh = residual && grads[1].defined() ? grads[1].contiguous() : at::Tensor();
    at::Tensor dx = at::empty_like(h);
    at::Tensor dw = at::zeros({C}, h.options().dtype(at::kDouble)), db = at::zeros_like(dw);  // [C]
    kernels::norm_backward(dy.const_data_ptr<float>(), dh.defined() ? dh.const_data_ptr<float>() : nullptr,
                           h.const_data_ptr<float>(), w.const_data_ptr<float>(), mean.const_data_ptr<float>(),
                           rstd.const_data_ptr<float>(), dx.mutable_data_ptr<float>(), dw.mutable_data_ptr<double>(),
                           db.mutable_data_ptr<double>(), N, C, rms);
    const at::Tensor dbias = ctx->saved_data["bias"].toBool() ? db.to(at::kFloat) : at::Tensor();
    // x and r get the same gradient (h = x + r): one tensor, read-only for both.
    return {dx, residual ? dx : at::Tensor(), dw.to(at::kFloat).view(w.sizes()), dbias, at::Tensor(), at::Tensor()};
  }
};

// Forward: ATen's silu and mul (vectorised exp; no pass to save there).
// Backward: sigmoid(gate) by ATen, then one loop writing both halves of the
// gradient, where autograd's ops run mul's two, silu's and two narrows'
// zero-filled [..., 2F] plus their sum.
struct FusedSwiglu : public torch::autograd::Function<FusedSwiglu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    const at::Tensor gu = gate_up.contiguous();
    ctx->save_for_backward({gu});
    return swiglu(gu);  // [..., F]
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor gu = ctx->get_saved_variables()[0];
    const int64_t F = gu.size(-1) / 2, N = gu.numel() / (2 * F);
    const at::Tensor dout = grads[0].contiguous();
    const at::Tensor sig = at::sigmoid(gu.narrow(-1, 0, F)).contiguous();  // [..., F]
    at::Tensor dgu = at::empty_like(gu);  // [..., 2F]
    kernels::swiglu_backward(dout.const_data_ptr<float>(), gu.const_data_ptr<float>(), sig.const_data_ptr<float>(),
                             dgu.mutable_data_ptr<float>(), N, F);
    return {dgu};
  }
};

// at::gelu (exact, erf) with the kernel each way; saves its input, as
// at::gelu's autograd does.
struct FusedGelu : public torch::autograd::Function<FusedGelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    const at::Tensor xc = x.contiguous();
    at::Tensor y = at::empty(xc.sizes(), xc.options());
    kernels::gelu_forward(xc.const_data_ptr<float>(), y.mutable_data_ptr<float>(), xc.numel());
    ctx->save_for_backward({xc});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].contiguous();
    at::Tensor dx = at::empty(x.sizes(), x.options());
    kernels::gelu_backward(dy.const_data_ptr<float>(), x.const_data_ptr<float>(), dx.mutable_data_ptr<float>(),
                           x.numel());
    return {dx};
  }
};

// gelu(x W^T + b) for x [M, K], W [F, K], b [F]: the GEMM without its
// bias (beta 0: addmm would first copy the bias into every row of the
// output), then one pass adds the bias in place and applies GELU. Saves x
// and the pre-activation, as the linear's and GELU's autograd nodes would.
// Backward: one pass for GELU's gradient and the bias's (the column sums,
// in double), then the linear's two GEMMs as linear_2d's backward runs
// them (dW into W's slot: grad_slot.h).
struct LinearBiasGelu : public torch::autograd::Function<LinearBiasGelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    at::Tensor pre = at::mm(x, w.t());  // [M, F], contiguous: the bias goes in below
    at::Tensor y = at::empty_like(pre);
    const at::Tensor bc = b.contiguous();
    kernels::bias_gelu_forward(pre.mutable_data_ptr<float>(), bc.const_data_ptr<float>(), y.mutable_data_ptr<float>(),
                               pre.size(0), pre.size(1));
    ctx->save_for_backward({x, pre});
    ctx->saved_data["w"] = w;  // the parameter itself, as grad_slot.cpp's SlotLinear keeps it
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &pre = saved[1];
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    const at::Tensor dy = grads[0].contiguous();
    const int64_t M = pre.size(0), F = pre.size(1);
    at::Tensor dpre = at::empty_like(pre);
    at::Tensor db = at::zeros({F}, pre.options().dtype(at::kDouble));
    kernels::gelu_backward_bias(dy.const_data_ptr<float>(), pre.const_data_ptr<float>(), dpre.mutable_data_ptr<float>(),
                                db.mutable_data_ptr<double>(), M, F);
    auto [dx, dw] = linear_2d_backward(x, w, dpre, ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    return {dx, dw, ctx->needs_input_grad(2) ? db.to(at::kFloat) : at::Tensor()};
  }
};

}  // namespace

at::Tensor fused_linear_gelu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (!b.defined() || !fusable({&x, &w, &b}) || x.numel() == 0 || fused_gelu_off() || fused_bias_gelu_off())
    return fused_gelu(detail::linear_nd(x, w, b));
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
  return LinearBiasGelu::apply(x2, w, b).view(sizes);
}

at::Tensor fused_gelu(const at::Tensor& x) {
  if (!fusable({&x}) || x.numel() == 0 || fused_gelu_off()) return at::gelu(x);
  return FusedGelu::apply(x);
}

at::Tensor fused_norm(const at::Tensor& x, const NormParams& p) {
  // A LayerNorm without a residual add is ATen's: one pass each way already
  // (the loop measured 1.17x its time, bench/fused_ops_engine_bench).
  if (!p.rms || !fusable({&x, &p.weight}) || x.numel() == 0) return reference_norm(x, p);
  const at::Tensor none = at::empty({0}, x.options());
  return FusedNorm::apply(x, none, p.weight, p.rms ? none : p.bias, p.eps, p.rms)[0];
}

std::pair<at::Tensor, at::Tensor> fused_add_norm(const at::Tensor& x, const at::Tensor& r, const NormParams& p) {
  if (!fusable({&x, &r, &p.weight, &p.bias}) || x.sizes() != r.sizes() || x.numel() == 0 ||
      !(p.rms || p.bias.defined())) {
    at::Tensor h = x + r;
    return {h, reference_norm(h, p)};
  }
  variable_list out = FusedNorm::apply(x, r, p.weight, p.rms ? at::empty({0}, x.options()) : p.bias, p.eps, p.rms);
  return {out[1], out[0]};
}

at::Tensor fused_swiglu(const at::Tensor& gate_up) {
  if (!fusable({&gate_up}) || gate_up.numel() == 0) return swiglu(gate_up);
  return FusedSwiglu::apply(gate_up);
}

}  // namespace dtrain::engine::model
