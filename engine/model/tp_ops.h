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
  // Sequence parallelism (Korthikanti et al. 2022): the residual stream,
  // LayerNorms and dropout hold this rank's T / size positions. Dim-0
  // collectives: out = concat of every rank's in; out = sum of chunk rank.
  bool sequence_parallel = false;
  bool vocab_parallel = true;  // false: the embedding and the head are whole on every rank
  // fault.kind no_tp_reduce (a wrong layout on purpose): row-parallel layers
  // keep their partial sums (with sequence parallelism: this rank's positions of them).
  bool fault_no_row_reduce = false;
  std::function<void(const at::Tensor&, at::Tensor&)> all_gather;
  std::function<void(const at::Tensor&, at::Tensor&)> reduce_scatter;
  bool active() const { return size > 1; }
  bool sp() const { return size > 1 && sequence_parallel; }
};

at::Tensor copy_to_tp(const at::Tensor& x, const TpGroup& tp);      // f
at::Tensor reduce_from_tp(const at::Tensor& x, const TpGroup& tp);  // g
// Sequence parallelism's f and g: [B, T/tp, C] -> [B, T, C] by all-gather
// along T (backward: reduce-scatter), and [B, T, C] partial sums ->
// [B, T/tp, C] by reduce-scatter along T (backward: all-gather).
at::Tensor gather_from_sp(const at::Tensor& x, const TpGroup& tp);
at::Tensor scatter_to_sp(const at::Tensor& x, const TpGroup& tp);

// tokens [B, T] int64, weight [V/tp, C] rows [vocab_begin, vocab_begin + V/tp)
// of the table -> [B, T, C] summed over the TP group ([B, T/tp, C], this
// rank's positions, with sequence parallelism).
at::Tensor vocab_parallel_embedding(const at::Tensor& tokens, const at::Tensor& weight,
                                    int64_t vocab_begin, const TpGroup& tp);

// logits [N, V/tp] (this rank's vocab columns from vocab_begin), targets [N]
// -> mean cross-entropy over N, the same on every TP rank.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        int64_t vocab_begin, const TpGroup& tp);

}  // namespace dtrain::engine::model
