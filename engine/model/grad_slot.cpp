// grad_slot.h: the slot registry and the linear layer that writes its
// weight gradient into the slot. The backward repeats autograd's own
// formulas for addmm (mm_mat1_backward, mm_mat2_backward; the bias's grad
// is dY, summed to [N] by the engine as for addmm), so the GEMMs are the
// same calls on the same operands: only dW's destination differs.
#include "engine/model/grad_slot.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <optional>
#include <unordered_map>

namespace dtrain::engine::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// param's TensorImpl -> its slot, keyed by the impl, which the registrant
// (Ddp) keeps alive while registered. Locked: ranks that are threads of one
// test process register side by side, and a GPU's backward runs on
// autograd's device thread. A slot is armed by register/arm_grad_slot and
// written once per arming: a weight used by two linear layers in one graph
// has its first gradient held in the slot (by autograd, until AccumulateGrad
// sums both), so the second must not write there (without the arming,
// test_engine's "grad slots" case counts the second gradient twice).
struct Slot {
  at::Tensor tensor;                 // a fixed slot (Ddp's bucket view)
  std::function<at::Tensor()> make;  // or one made at each claim (ZeRO-2/3)
  const void* owner = nullptr;       // make's registrant
  c10::Device device = c10::kCPU;
  bool armed = true;
};
std::mutex slots_mu;
std::unordered_map<const c10::TensorImpl*, Slot> slots;

// The registered slot's device, if param has one.
std::optional<c10::Device> slot_device(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(slots_mu);
  auto it = slots.find(param.unsafeGetTensorImpl());
  if (it == slots.end()) return std::nullopt;
  return it->second.device;
}

// The slot, disarmed, if it is armed; undefined otherwise.
at::Tensor claim_slot(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(slots_mu);
  auto it = slots.find(param.unsafeGetTensorImpl());
  if (it == slots.end() || !it->second.armed) return {};
  it->second.armed = false;
  return it->second.make ? it->second.make() : it->second.tensor;
}

// Column-major 2-D (strides 1, rows): autograd's formulas transpose their
// result for such operands; so do we.
bool column_major(const at::Tensor& t) { return t.stride(0) == 1 && t.stride(1) == t.size(0); }

// (Two functions: an autograd function's tensor inputs must be defined.)
at::Tensor slot_linear_forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  ctx->save_for_backward({x});
  ctx->saved_data["w"] = w;  // the parameter itself: its grad says whether this is the first backward
  return b.defined() ? at::addmm(b, x, w.t()) : at::mm(x, w.t());  // [M, N]
}

variable_list slot_linear_backward(AutogradContext* ctx, const variable_list& grads, bool bias) {
  const at::Tensor x = ctx->get_saved_variables()[0];
  const at::Tensor w = ctx->saved_data["w"].toTensor();
  const at::Tensor& dy = grads[0];  // [M, N]
  auto [dx, dw] = linear_2d_backward(x, w, dy, ctx->needs_input_grad(0), ctx->needs_input_grad(1));
  if (!bias) return {dx, dw};
  // The bias's grad as addmm's: dY itself, summed to [N] by the engine.
  return {dx, dw, ctx->needs_input_grad(2) ? dy : at::Tensor()};
}

struct SlotLinear : public torch::autograd::Function<SlotLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    return slot_linear_forward(ctx, x, w, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return slot_linear_backward(ctx, grads, true);
  }
};

struct SlotLinearNoBias : public torch::autograd::Function<SlotLinearNoBias> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    return slot_linear_forward(ctx, x, w, {});
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return slot_linear_backward(ctx, grads, false);
  }
};

}  // namespace

void register_grad_slot(const at::Tensor& param, const at::Tensor& slot) {
  std::lock_guard<std::mutex> lock(slots_mu);
  slots[param.unsafeGetTensorImpl()] = Slot{slot, {}, nullptr, slot.device(), true};
}

void register_grad_slot(const at::Tensor& param, c10::Device device, std::function<at::Tensor()> make,
                        const void* owner) {
  std::lock_guard<std::mutex> lock(slots_mu);
  slots[param.unsafeGetTensorImpl()] = Slot{{}, std::move(make), owner, device, true};
}

void arm_grad_slot(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(slots_mu);
  auto it = slots.find(param.unsafeGetTensorImpl());
  if (it != slots.end()) it->second.armed = true;
}

void unregister_grad_slot(const at::Tensor& param, const at::Tensor& slot) {
  std::lock_guard<std::mutex> lock(slots_mu);
  auto it = slots.find(param.unsafeGetTensorImpl());
  if (it != slots.end() && !it->second.make && it->second.tensor.data_ptr() == slot.data_ptr()) slots.erase(it);
}

void unregister_grad_slot_of(const at::Tensor& param, const void* owner) {
  std::lock_guard<std::mutex> lock(slots_mu);
  auto it = slots.find(param.unsafeGetTensorImpl());
  if (it != slots.end() && it->second.make && it->second.owner == owner) slots.erase(it);
}

bool has_grad_slot(const at::Tensor& param) { return slot_device(param).has_value(); }

std::pair<at::Tensor, at::Tensor> linear_2d_backward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& dy,
                                                     bool need_dx, bool need_dw) {
  at::Tensor dx, dw;
  if (need_dx)  // mm_mat1_backward(dY, W^T)
    dx = column_major(x) ? w.t().mm(dy.t()).t() : dy.mm(w);
  if (need_dw) {
    // mm_mat2_backward(dY, X) for W^T (column-major) is (dY^T X)^T, and
    // W's grad its transpose: dY^T X, [N, K].
    at::Tensor slot;
    if (!w.grad().defined() && !c10::GradMode::is_enabled()) slot = claim_slot(w);
    if (slot.defined()) {
      slot = slot.view(slot.sizes());  // a handle of its own: AccumulateGrad adopts it as the grad
      at::mm_out(slot, dy.t(), x);
      dw = std::move(slot);
    } else {
      dw = dy.t().mm(x);
    }
  }
  return {std::move(dx), std::move(dw)};
}

at::Tensor linear_2d(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const auto device = slot_device(w);
  if (device && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && x.device() == *device &&
      !at::autocast::is_autocast_enabled(x.device().type()))
    return b.defined() ? SlotLinear::apply(x, w, b) : SlotLinearNoBias::apply(x, w);
  return at::linear(x, w, b);
}

}  // namespace dtrain::engine::model
