// The TP operators of tp_ops.h as custom autograd functions.
#include "engine/model/tp_ops.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/log.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace dtrain::engine::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through the context as a raw pointer: the TpGroup lives
// in the model, which outlives every backward of its forward.
struct CopyToTp : public torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const TpGroup* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* tp = reinterpret_cast<const TpGroup*>(ctx->saved_data["tp"].toInt());
    at::Tensor g = grads[0].contiguous().clone();
    tp->sum(g);
    return {g, at::Tensor()};
  }
};

struct ReduceFromTp : public torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, const TpGroup* tp) {
    at::Tensor out = x.contiguous().clone();
    tp->sum(out);
    return out;
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

// Along T (dim 1) of [B, T, C] with dim-0 collectives: T goes first.
at::Tensor all_gather_seq(const at::Tensor& x, const TpGroup& tp) {
  at::Tensor in = x.transpose(0, 1).contiguous();  // [T/tp, B, C]
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] *= tp.size;
  at::Tensor out = at::empty(shape, in.options());  // [T, B, C]
  tp.all_gather(in, out);
  return out.transpose(0, 1).contiguous();  // [B, T, C]
}

at::Tensor reduce_scatter_seq(const at::Tensor& x, const TpGroup& tp) {
  at::Tensor in = x.transpose(0, 1).contiguous();  // [T, B, C]
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] /= tp.size;
  at::Tensor out = at::empty(shape, in.options());  // [T/tp, B, C]
  tp.reduce_scatter(in, out);
  return out.transpose(0, 1).contiguous();  // [B, T/tp, C]
}

struct GatherFromSp : public torch::autograd::Function<GatherFromSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const TpGroup* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    return all_gather_seq(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* tp = reinterpret_cast<const TpGroup*>(ctx->saved_data["tp"].toInt());
    return {reduce_scatter_seq(grads[0], *tp), at::Tensor()};
  }
};

struct ScatterToSp : public torch::autograd::Function<ScatterToSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const TpGroup* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    return reduce_scatter_seq(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* tp = reinterpret_cast<const TpGroup*>(ctx->saved_data["tp"].toInt());
    return {all_gather_seq(grads[0], *tp), at::Tensor()};
  }
};

}  // namespace

at::Tensor gather_from_sp(const at::Tensor& x, const TpGroup& tp) {
  return tp.sp() ? GatherFromSp::apply(x, &tp) : x;
}

at::Tensor scatter_to_sp(const at::Tensor& x, const TpGroup& tp) {
  return tp.sp() ? ScatterToSp::apply(x, &tp) : x;
}

at::Tensor copy_to_tp(const at::Tensor& x, const TpGroup& tp) {
  return tp.active() ? CopyToTp::apply(x, &tp) : x;
}

at::Tensor reduce_from_tp(const at::Tensor& x, const TpGroup& tp) {
  return tp.active() ? ReduceFromTp::apply(x, &tp) : x;
}

at::Tensor vocab_parallel_embedding(const at::Tensor& tokens, const at::Tensor& weight,
                                    int64_t vocab_begin, const TpGroup& tp) {
  if (!tp.active()) return at::embedding(weight, tokens);
  const int64_t rows = weight.size(0);
  const at::Tensor mine = (tokens >= vocab_begin).logical_and(tokens < vocab_begin + rows);  // [B, T]
  const at::Tensor local = at::where(mine, tokens - vocab_begin, at::zeros_like(tokens));    // [B, T]
  at::Tensor out = at::embedding(weight, local) * mine.unsqueeze(-1).to(weight.scalar_type());  // [B, T, C]
  return tp.sp() ? scatter_to_sp(out, tp) : reduce_from_tp(out, tp);
}

// loss_i = log(sum_v exp(z_iv - M_i)) - (z_i,t - M_i), M_i = max over the
// whole vocab. The max is a constant for autograd (it cancels); the sum of
// exponentials and the target logit are sums over the group (g).
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        int64_t vocab_begin, const TpGroup& tp) {
  const int64_t cols = logits.size(1);
  at::Tensor m;
  {
    at::NoGradGuard no_grad;
    m = std::get<0>(logits.max(/*dim=*/1, /*keepdim=*/true)).contiguous();  // [N, 1]
    tp.max(m);
  }
  const at::Tensor z = logits - m;                                                          // [N, V/tp]
  const at::Tensor sum_exp = reduce_from_tp(at::exp(z).sum(/*dim=*/1), tp);                 // [N]
  const at::Tensor mine = (targets >= vocab_begin).logical_and(targets < vocab_begin + cols);  // [N]
  const at::Tensor local = at::where(mine, targets - vocab_begin, at::zeros_like(targets));    // [N]
  const at::Tensor picked = z.gather(1, local.unsqueeze(1)).squeeze(1) * mine.to(z.scalar_type());  // [N]
  const at::Tensor target_logit = reduce_from_tp(picked, tp);                               // [N]
  return (at::log(sum_exp) - target_logit).mean();
}

}  // namespace dtrain::engine::model
