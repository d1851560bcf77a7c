// A pipeline stage's backward in two halves, for zero-bubble schedules
// (Qi et al. 2023): the input half computes only the gradient of the stage's
// input (what the previous stage waits for), the weight half later the
// parameters' gradients. Owns the autograd-graph bookkeeping between the
// halves; it does not choose when they run (the schedule's plan does) and
// never communicates.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace dtrain::engine::parallel {

class SplitBackward {
 public:
  SplitBackward();
  ~SplitBackward();
  SplitBackward(SplitBackward&&) noexcept;
  SplitBackward& operator=(SplitBackward&&) noexcept;

  // Runs autograd from `root` (seeded with `root_grad`; undefined for a
  // scalar root: 1) to the leaf `input` only, so the weight-gradient
  // matmuls are skipped, and keeps what the weight half needs: at every node
  // where a parameter's gradient path leaves the input path, the gradient
  // that node received. `params`: the stage's parameters. Keeps the graph.
  // Returns the gradient of `input`.
  at::Tensor backward_input(const at::Tensor& root, const at::Tensor& root_grad, const at::Tensor& input,
                            const std::vector<at::Tensor>& params);

  // Runs autograd from those nodes to the parameters, one engine call per
  // group of parameters that share such nodes (so no gradient flows into
  // another group's node and is counted twice), accumulating into .grad
  // through the parameters' AccumulateGrad nodes: gradient hooks (DDP,
  // ZeRO) fire as in a whole backward. Once, after backward_input.
  void backward_weight();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dtrain::engine::parallel
