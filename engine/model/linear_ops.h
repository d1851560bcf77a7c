// Linear layers as the model's modules run them (internal to engine/model:
// gpt.cpp and llama_model.cpp): x W^T (+ b) as one 2-D GEMM, and the input
// of column-parallel layers under tensor parallelism.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "engine/model/grad_slot.h"
#include "engine/model/tp_ops.h"

namespace dtrain::engine::model::detail {

// x W^T (+ b) over the last dim of x as one 2-D GEMM. at::linear runs a
// [B, T, K] input as matmul plus a separate bias add, one more pass over
// the output in forward and its own reduction in backward; flattened to
// [B*T, K], the bias rides in addmm's beta term.
// Under DDP the weight's gradient goes straight into its bucket slot
// (grad_slot.h).
inline at::Tensor linear_nd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {}) {
  if (x.dim() == 2) return linear_2d(x, w, b);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  return linear_2d(x.reshape({-1, x.size(-1)}), w, b).view(sizes);
}

// The input of column-parallel layers: x itself, or x copied into the TP
// region, or (sequence parallelism) all-gathered along T; once for layers
// that share it (llama's q and kv).
inline at::Tensor tp_input(const at::Tensor& x, const TpGroup* tp) {
  if (!tp || !tp->active()) return x;
  return tp->sp() ? gather_from_sp(x, *tp) : copy_to_tp(x, *tp);
}

}  // namespace dtrain::engine::model::detail
