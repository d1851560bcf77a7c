// AdamW, the learning-rate schedule and the gradient-norm helpers of adamw.h.
// The update is torch.optim.AdamW's single-tensor path: on contiguous fp32
// CPU tensors one fused pass per tensor (decay, both moments, the step: each
// element read and written once, no temporaries), elsewhere in-place ATen ops
// under NoGradGuard. Both compute the same formula in fp32 in the same order.
// Does not all-reduce anything: the caller combines norms across ranks.
#include "engine/optim/adamw.h"

#include "common/error.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <string>

namespace dtrain::engine::optim {
namespace {

struct FusedStep {
  float decay;      // 1 - lr * weight_decay (1 = none)
  float b1, one_minus_b1, b2, one_minus_b2;
  float bc2_sqrt;   // sqrt(1 - b2^t)
  float eps;
  float neg_step;   // -lr / (1 - b1^t)
};

bool fusable(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v) {
  for (const at::Tensor* t : {&p, &g, &m, &v})
    if (!t->device().is_cpu() || t->scalar_type() != at::kFloat || !t->is_contiguous()) return false;
  return p.numel() == g.numel();
}

// One pass over n elements: the ATen path's five ops, element by element,
// with the same fp32 roundings in the same order (no fused multiply-add:
// the file is compiled for baseline x86-64, which has none).
void fused_adamw(float* __restrict p, const float* __restrict g, float* __restrict m,
                 float* __restrict v, int64_t n, const FusedStep& s) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float pi = p[i] * s.decay;
    const float mi = m[i] * s.b1 + s.one_minus_b1 * gi;
    const float vi = v[i] * s.b2 + s.one_minus_b2 * gi * gi;
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + s.neg_step * (mi / denom);
  }
}

}  // namespace

AdamW::AdamW(std::vector<at::Tensor> params, std::vector<bool> decay, AdamWOptions options,
             std::vector<at::Tensor> grads)
    : params_(std::move(params)), decay_(std::move(decay)), grads_(std::move(grads)), opt_(options) {
  if (decay_.size() != params_.size() || (!grads_.empty() && grads_.size() != params_.size())) {
    throw Error(ErrorCode::internal, "AdamW: " + std::to_string(params_.size()) + " params but " +
                                         std::to_string(decay_.size()) + " decay flags and " +
                                         std::to_string(grads_.size()) + " grads");
  }
  // State allocated up front (not lazily) so a checkpoint can be loaded into
  // it before the first step.
  m_.reserve(params_.size());
  v_.reserve(params_.size());
  at::NoGradGuard no_grad;
  for (const auto& p : params_) {
    m_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    v_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_;
  const double b1 = opt_.beta1, b2 = opt_.beta2;
  const double bias_correction1 = 1.0 - std::pow(b1, double(step_));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(b2, double(step_)));
  const double step_size = lr / bias_correction1;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& g = grads_.empty() ? p.grad() : grads_[i];
    if (!g.defined()) continue;
    if (opt_.fused && fusable(p, g, m_[i], v_[i])) {
      const bool wd = decay_[i] && opt_.weight_decay != 0.0;
      const FusedStep fs{wd ? float(1.0 - lr * opt_.weight_decay) : 1.0f, float(b1), float(1.0 - b1),
                         float(b2), float(1.0 - b2), float(bias_correction2_sqrt), float(opt_.eps),
                         float(-step_size)};
      fused_adamw(p.data_ptr<float>(), g.data_ptr<float>(), m_[i].data_ptr<float>(),
                  v_[i].data_ptr<float>(), p.numel(), fs);
      continue;
    }
    if (decay_[i] && opt_.weight_decay != 0.0) p.mul_(1.0 - lr * opt_.weight_decay);  // decoupled decay
    m_[i].mul_(b1).add_(g, 1.0 - b1);                  // m = b1 m + (1 - b1) g
    v_[i].mul_(b2).addcmul_(g, g, 1.0 - b2);           // v = b2 v + (1 - b2) g^2
    auto denom = v_[i].sqrt().div_(bias_correction2_sqrt).add_(opt_.eps);  // sqrt(vhat) + eps
    p.addcdiv_(m_[i], denom, -step_size);              // p -= lr * mhat / denom
  }
}

void AdamW::zero_grad() {
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor g = grads_.empty() ? params_[i].grad() : grads_[i];
    if (g.defined()) g.zero_();
  }
}

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return lr * double(step + 1) / double(warmup_steps);
  // Cosine from lr (first step after warmup) to min_lr (the last step,
  // total_steps - 1); min_lr afterwards.
  const int64_t span = int64_t(total_steps) - warmup_steps - 1;
  if (span <= 0) return step < total_steps ? lr : min_lr;
  double progress = double(step - warmup_steps) / double(span);
  if (progress > 1.0) progress = 1.0;
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (lr - min_lr);
}

namespace {

// Sum of squares of n floats, accumulated in fp64 in one read of the data
// (at::sum(g * g, kDouble) writes g * g and then an fp64 copy of it first).
// Eight independent accumulators so the compiler can keep several in
// flight; their order is fixed, so the result is the same on every call.
double sq_sum_fp32(const float* p, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += double(p[i + j]) * double(p[i + j]);
  for (; i < n; ++i) acc[0] += double(p[i]) * double(p[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

double local_grad_sq_norm(const std::vector<at::Tensor>& grads) {
  at::NoGradGuard no_grad;
  double total = 0.0;
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    if (g.is_cpu() && g.scalar_type() == at::kFloat && g.is_contiguous())
      total += sq_sum_fp32(g.const_data_ptr<float>(), g.numel());
    else
      total += at::sum(g.mul(g), at::kDouble).item().toDouble();  // accumulate in fp64
  }
  return total;
}

void scale_grads(const std::vector<at::Tensor>& grads, double factor) {
  if (factor == 1.0) return;
  at::NoGradGuard no_grad;
  for (auto g : grads) {
    if (g.defined()) g.mul_(factor);
  }
}

}  // namespace dtrain::engine::optim
