// NoPipeline (schedule.h): the micro-step loop of one step without pipeline
// stages, and the bf16 autocast scope every schedule's forward uses.
#include "engine/parallel/schedule.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>

namespace dtrain::engine::parallel {
namespace {

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

class NoPipeline : public Schedule {
 public:
  double run(ModelParts& parts, GradSync& sync, BatchSource& batches,
             const StepOptions& options) override {
    double loss_sum = 0;
    const c10::DeviceType type = parts.named_params.empty()
                                     ? c10::DeviceType::CPU
                                     : parts.named_params.front().second.device().type();
    for (int micro = 0; micro < options.grad_accum; ++micro) {
      sync.begin_micro(micro, micro == options.grad_accum - 1);
      batches.micro_batch(micro, inputs_, targets_);  // [B, T] each
      parts.model->set_dropout_position({options.seed, options.step, batches.global_rows(), batches.row_begin(micro)});
      at::Tensor loss;
      {
        AutocastScope autocast(type, options.bf16);
        loss = parts.model->loss(inputs_, targets_);  // [] fp32 mean over B*T
      }
      loss.mul(options.loss_scale).backward();
      loss_sum += loss.item<double>();
    }
    return loss_sum;
  }
  const char* name() const override { return "none (micro-step loop)"; }

 private:
  at::Tensor inputs_, targets_;
};

}  // namespace

std::unique_ptr<Schedule> make_no_pipeline() { return std::make_unique<NoPipeline>(); }

}  // namespace dtrain::engine::parallel
