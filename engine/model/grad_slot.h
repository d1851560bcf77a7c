// Weight gradients computed straight into their data-parallel bucket slot
// (Megatron-LM's gradient-accumulation fusion into main_grad, for the step's
// first backward): a linear layer whose weight has a registered slot writes
// dW = dY^T X into it with the GEMM's own output, and hands that view to
// AccumulateGrad (which adopts it as the grad), so DDP has nothing to copy
// into the bucket afterwards. Same GEMM calls, same bits as at::linear's
// autograd. Internal to the engine: parallel::Ddp registers its slots,
// linear_ops.h's linear_nd uses them.
#pragma once

#include <ATen/core/Tensor.h>

namespace dtrain::engine::model {

// While registered, a backward that finds param's grad unset (the step's
// first, after zero_grad) computes param's gradient into `slot` (param's
// shape, dtype and device) where linear_2d computes it, once per arming
// (registering arms it; so does arm_grad_slot, when the grads are unset
// for the next step; a second use of the weight in the same graph takes
// autograd's own path). Unregister before either tensor goes away.
void register_grad_slot(const at::Tensor& param, const at::Tensor& slot);
void arm_grad_slot(const at::Tensor& param);
// (only where `slot` is still the one registered: a newer registrant's stays)
void unregister_grad_slot(const at::Tensor& param, const at::Tensor& slot);
bool has_grad_slot(const at::Tensor& param);

// x [M, K] W^T (+ b) as at::linear computes it (addmm; the same bits
// forward and backward), through the slot path when w has a slot, x and w
// are fp32 on the slot's device and no autocast is on; at::linear otherwise.
at::Tensor linear_2d(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

}  // namespace dtrain::engine::model
