// Unit tests of engine/parallel/pipeline/split_backward: on a small stage
// (LayerNorm, two linears with a GELU between, a residual, a loss), the
// input half returns the input's gradient and leaves every parameter's
// .grad untouched; the weight half then fills them; both equal one whole
// backward (printed max differences), a second micro-batch accumulates, and
// gradient hooks on the accumulators fire in the weight half.
#include "engine/parallel/pipeline/split_backward.h"

#include <ATen/ATen.h>
#include <doctest/doctest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <vector>

#include "common/error.h"

using dtrain::engine::parallel::SplitBackward;

namespace {

struct Stage {
  std::vector<at::Tensor> params;  // ln w, ln b, fc w, fc b, proj w, proj b
  explicit Stage(int64_t c) {
    at::manual_seed(7);
    params = {at::randn({c}), at::randn({c}), at::randn({4 * c, c}) * 0.1, at::randn({4 * c}) * 0.1,
              at::randn({c, 4 * c}) * 0.1, at::randn({c}) * 0.1};
    for (auto& p : params) p.requires_grad_(true);
  }
  // [B, T, C] -> [B, T, C]: x + proj(gelu(fc(ln(x))))
  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = at::layer_norm(x, {x.size(-1)}, params[0], params[1]);
    h = at::gelu(at::linear(h, params[2], params[3]));
    return x + at::linear(h, params[4], params[5]);
  }
};

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

class CountHook : public torch::autograd::FunctionPostHook {
 public:
  explicit CountHook(int* count) : count_(count) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& out,
                                            const torch::autograd::variable_list&) override {
    ++*count_;
    return out;
  }

 private:
  int* count_;
};

}  // namespace

TEST_CASE("split backward: input half, then weight half, equals one backward") {
  const int64_t B = 2, T = 5, C = 8;
  Stage whole(C), split(C);
  at::manual_seed(11);
  const at::Tensor x0 = at::randn({B, T, C}), x1 = at::randn({B, T, C}), g0 = at::randn({B, T, C});

  // Reference: two micro-batches, a whole backward each (the second from a loss).
  at::Tensor in0 = x0.clone().requires_grad_(true), in1 = x1.clone().requires_grad_(true);
  whole.forward(in0).backward(g0);
  whole.forward(in1).pow(2).mean().backward();

  int hooks = 0;
  std::vector<decltype(torch::autograd::impl::grad_accumulator(split.params[0]))> accs;
  for (auto& p : split.params) {
    accs.push_back(torch::autograd::impl::grad_accumulator(p));
    accs.back()->add_post_hook(std::make_unique<CountHook>(&hooks));
  }
  at::Tensor s0 = x0.clone().requires_grad_(true), s1 = x1.clone().requires_grad_(true);
  SplitBackward b0, b1;
  const at::Tensor dx0 = b0.backward_input(split.forward(s0), g0, s0, split.params);
  const at::Tensor dx1 = b1.backward_input(split.forward(s1).pow(2).mean(), {}, s1, split.params);
  for (auto& p : split.params) CHECK_FALSE(p.grad().defined());  // the input halves computed no weight gradient
  CHECK(hooks == 0);
  CHECK_FALSE(s0.grad().defined());  // returned, not accumulated
  b0.backward_weight();
  CHECK(hooks == 6);
  b1.backward_weight();
  CHECK(hooks == 12);

  double worst = max_abs_diff(dx0, in0.grad());
  worst = std::max(worst, max_abs_diff(dx1, in1.grad()));
  for (size_t i = 0; i < split.params.size(); ++i) {
    REQUIRE(split.params[i].grad().defined());
    worst = std::max(worst, max_abs_diff(split.params[i].grad(), whole.params[i].grad()));
  }
  MESSAGE("split vs whole backward: max abs diff " << worst << " (tol 1e-6) over input and parameter gradients");
  CHECK(worst <= 1e-6);
  // Negative control: with one micro-batch's halves only, the fc weight's
  // gradient is far from the two-micro-batch one.
  SplitBackward lone;
  Stage half(C);
  at::Tensor h0 = x0.clone().requires_grad_(true);
  lone.backward_input(half.forward(h0), g0, h0, half.params);
  lone.backward_weight();
  CHECK(max_abs_diff(half.params[2].grad(), whole.params[2].grad()) > 1e-3);
  CHECK_THROWS_AS(lone.backward_weight(), dtrain::Error);  // once per input half
}
