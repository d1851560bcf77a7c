// NoPipeline (schedule.h): the micro-step loop of one step without pipeline
// stages.
#include "engine/parallel/schedule.h"

#include "common/timeline.h"
#include "engine/comm/traced_group.h"
#include "engine/parallel/autocast_scope.h"

#include <ATen/core/Tensor.h>

namespace dtrain::engine::parallel {
namespace {

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
      comm::trace_phase(trace::Phase::forward);
      {
        timeline::Scope span(timeline::Kind::forward, micro);
        AutocastScope autocast(type, options.bf16);
        loss = parts.model->loss(inputs_, targets_);  // [] fp32 mean over B*T
      }
      comm::trace_phase(trace::Phase::backward);
      {
        timeline::Scope span(timeline::Kind::backward, micro);
        loss.mul(options.loss_scale).backward();
      }
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
