// AutocastScope: train.precision bf16 as torch.autocast's C++ form, around
// a schedule's forwards (every schedule uses it).
#pragma once

#include <ATen/autocast_mode.h>

namespace dtrain::engine::parallel {

// train.precision bf16: autocast (torch.autocast's C++ form) around the
// forward: matmuls and attention in bf16, reductions and the loss in fp32;
// parameters, gradients and AdamW stay fp32.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType type, bool enabled) : type_(type), enabled_(enabled) {
    if (!enabled_) return;
    prev_enabled_ = at::autocast::is_autocast_enabled(type_);
    prev_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::set_autocast_dtype(type_, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, prev_enabled_);
    at::autocast::set_autocast_dtype(type_, prev_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType type_;
  bool enabled_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

}  // namespace dtrain::engine::parallel
