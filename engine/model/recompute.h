// Activation recomputation as an autograd function: a piece of the forward
// (a Segment) runs without keeping its intermediate tensors, and backward
// runs it again from its saved inputs to get the gradients. Owns only the
// mechanism; which pieces are recomputed is the layout's choice
// (engine/parallel/activation_checkpoint.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace dtrain::engine::model {

// A piece of the forward: output from `inputs`. It may use parameters and
// model state it reaches itself; it must capture nothing by reference that
// dies before backward (it runs again there).
using Segment = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

// The model's seam for a layout that changes how a segment runs (activation
// checkpointing): gets the segment, its differentiable inputs and the
// parameters it uses, returns its output. Empty: the segment runs directly.
using SegmentRunner = std::function<at::Tensor(Segment fn, const std::vector<at::Tensor>& inputs,
                                               const std::vector<at::Tensor>& params)>;

// Runs `fn(inputs)` with autograd off and returns its output attached to a
// node whose backward re-enters `fn` with autograd on, under the autocast
// state of the forward, and returns the gradients of `inputs` and of
// `params` (the parameters fn uses). The parameter gradients are outputs of
// that node, so autograd accumulates them in the outer backward (gradient
// hooks of DDP and ZeRO fire as without recomputation). `around_recompute`
// (optional) is called with true before the recomputation and with false
// after it (to restore model state such as the dropout position).
at::Tensor recompute_in_backward(Segment fn, const std::vector<at::Tensor>& inputs,
                                 const std::vector<at::Tensor>& params,
                                 std::function<void(bool before)> around_recompute = {});

}  // namespace dtrain::engine::model
