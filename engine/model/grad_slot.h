// Weight gradients computed straight into their data-parallel bucket slot
// (Megatron-LM's gradient-accumulation fusion into main_grad, for the step's
// first backward): a linear layer whose weight has a registered slot writes
// dW = dY^T X into it with the GEMM's own output, and hands that view to
// AccumulateGrad (which adopts it as the grad), so DDP has nothing to copy
// into the bucket afterwards, and ZeRO-2/3 nothing into a unit's
// reduce-scatter input. Same GEMM calls, same bits as at::linear's
// autograd. Internal to the engine: parallel::Ddp and the ZeRO sync register
// their slots, linear_ops.h's linear_nd uses them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <utility>

namespace dtrain::engine::model {

// While registered, a backward that finds param's grad unset (the step's
// first, after zero_grad) computes param's gradient into `slot` (param's
// shape, dtype and device) where linear_2d computes it, once per arming
// (registering arms it; so does arm_grad_slot, when the grads are unset
// for the next step; a second use of the weight in the same graph takes
// autograd's own path). Unregister before either tensor goes away.
void register_grad_slot(const at::Tensor& param, const at::Tensor& slot);
// The same with a slot made when a backward claims it: make() (called under
// the registry's lock, so it must not call back into it) returns the slot
// for this arming (param's shape and dtype, on `device`). ZeRO-2/3 make a
// unit's reduce-scatter input this way, once its backward reaches it.
// `owner` identifies the registrant for unregister_grad_slot_of.
void register_grad_slot(const at::Tensor& param, c10::Device device, std::function<at::Tensor()> make,
                        const void* owner);
void arm_grad_slot(const at::Tensor& param);
// (only where `slot` is still the one registered: a newer registrant's stays)
void unregister_grad_slot(const at::Tensor& param, const at::Tensor& slot);
// (only where `owner` registered the slot now registered)
void unregister_grad_slot_of(const at::Tensor& param, const void* owner);
bool has_grad_slot(const at::Tensor& param);

// x [M, K] W^T (+ b) as at::linear computes it (addmm; the same bits
// forward and backward), through the slot path when w has a slot, x and w
// are fp32 on the slot's device and no autocast is on; at::linear otherwise.
at::Tensor linear_2d(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

// The input's and the weight's gradients of x [M, K] W^T given dY [M, N],
// as linear_2d's backward computes them (the same GEMM calls; dW into w's
// slot where one is armed and this is the step's first backward), for an
// autograd function that runs the linear itself (fused_ops.h's
// fused_linear_gelu). Either is undefined where not needed.
std::pair<at::Tensor, at::Tensor> linear_2d_backward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& dy,
                                                     bool need_dx, bool need_dw);

}  // namespace dtrain::engine::model
