// recompute_in_backward (recompute.h): a custom autograd function whose
// forward runs the segment under no-grad and whose backward recomputes it
// and differentiates the recomputed graph with torch::autograd::grad (not
// backward(), so no gradient is accumulated inside the nested pass).
#include "engine/model/recompute.h"

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "common/error.h"

namespace dtrain::engine::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved inputs: the segment, the parameters
// (held here, not saved: ZeRO-3 frees and refills their storage between
// forward and backward) and the forward's autocast state.
struct SegmentState : torch::CustomClassHolder {
  Segment fn;
  std::vector<at::Tensor> params;
  std::function<void(bool)> around;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;
};

// The forward's autocast state, re-entered for the recomputation.
class AutocastAgain {
 public:
  explicit AutocastAgain(const SegmentState& s) : s_(s) {
    prev_ = at::autocast::is_autocast_enabled(s.device_type);
    prev_dtype_ = at::autocast::get_autocast_dtype(s.device_type);
    at::autocast::set_autocast_enabled(s.device_type, s.autocast);
    at::autocast::set_autocast_dtype(s.device_type, s.autocast_dtype);
    if (s.autocast) at::autocast::increment_nesting();
  }
  ~AutocastAgain() {
    if (s_.autocast && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(s_.device_type, prev_);
    at::autocast::set_autocast_dtype(s_.device_type, prev_dtype_);
  }
  AutocastAgain(const AutocastAgain&) = delete;
  AutocastAgain& operator=(const AutocastAgain&) = delete;

 private:
  const SegmentState& s_;
  bool prev_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

struct Recompute : public torch::autograd::Function<Recompute> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs, at::TensorList params,
                            c10::intrusive_ptr<SegmentState> state) {
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["n_inputs"] = int64_t(inputs.size());
    ctx->saved_data["state"] = at::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(state));
    (void)params;  // edges only: their gradients are this node's outputs
    return state->fn(inputs.vec());  // autograd is off here (Function::apply)
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto state = c10::static_intrusive_pointer_cast<SegmentState>(ctx->saved_data["state"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;  // detached copies the recomputed graph starts from
    variable_list wrt;               // what gradients are asked for
    for (const auto& x : saved) {
      inputs.push_back(x.detach().requires_grad_(x.requires_grad()));
      if (x.requires_grad()) wrt.push_back(inputs.back());
    }
    for (const auto& p : state->params) wrt.push_back(p);
    at::Tensor out;
    {
      at::AutoGradMode grad_on(true);
      AutocastAgain autocast(*state);
      if (state->around) state->around(true);
      try {
        out = state->fn(inputs);
      } catch (...) {
        if (state->around) state->around(false);
        throw;
      }
      if (state->around) state->around(false);
    }
    variable_list grads;
    if (out.requires_grad())
      grads = torch::autograd::grad({out}, wrt, {grad_out[0]}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    else
      grads.assign(wrt.size(), at::Tensor());
    variable_list result;  // one per forward argument: inputs, params, then the state
    size_t g = 0;
    for (const auto& x : saved) result.push_back(x.requires_grad() ? grads[g++] : at::Tensor());
    for (size_t i = 0; i < state->params.size(); ++i) result.push_back(grads[g++]);
    result.emplace_back();
    return result;
  }
};

}  // namespace

at::Tensor recompute_in_backward(Segment fn, const std::vector<at::Tensor>& inputs,
                                 const std::vector<at::Tensor>& params,
                                 std::function<void(bool before)> around_recompute) {
  if (!c10::GradMode::is_enabled()) return fn(inputs);  // no backward will come
  auto state = c10::make_intrusive<SegmentState>();
  state->fn = std::move(fn);
  state->params = params;
  state->around = std::move(around_recompute);
  if (!inputs.empty()) state->device_type = inputs.front().device().type();
  state->autocast = at::autocast::is_autocast_enabled(state->device_type);
  state->autocast_dtype = at::autocast::get_autocast_dtype(state->device_type);
  return Recompute::apply(at::TensorList(inputs), at::TensorList(params), state);
}

}  // namespace dtrain::engine::model
