// Tensor parallelism as the model sees it (Megatron-LM, Shoeybi et al. 2019):
// the TP group is a rank, a size and in-place all-reduces over it (the
// model does not know comm/), and the operators that make a layer split
// across that group still compute the 1-process function:
//   copy_to_tp (Megatron's f): identity forward, all-reduce of the grad backward
//   reduce_from_tp (g):        all-reduce forward, identity backward
// plus the vocab-parallel embedding and cross-entropy, which never gather
// the full [tokens, vocab] logits.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace dtrain::engine::model {

struct TpGroup {
  int rank = 0;
  int size = 1;
  std::function<void(at::Tensor&)> sum;  // in place, over the TP group
  std::function<void(at::Tensor&)> max;  // in place, over the TP group (no grad)
  bool active() const { return size > 1; }
};

at::Tensor copy_to_tp(const at::Tensor& x, const TpGroup& tp);      // f
at::Tensor reduce_from_tp(const at::Tensor& x, const TpGroup& tp);  // g

// tokens [B, T] int64, weight [V/tp, C] rows [vocab_begin, vocab_begin + V/tp)
// of the table -> [B, T, C], summed over the TP group.
at::Tensor vocab_parallel_embedding(const at::Tensor& tokens, const at::Tensor& weight,
                                    int64_t vocab_begin, const TpGroup& tp);

// logits [N, V/tp] (this rank's vocab columns from vocab_begin), targets [N]
// -> mean cross-entropy over N, the same on every TP rank.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        int64_t vocab_begin, const TpGroup& tp);

}  // namespace dtrain::engine::model
