// NoPipeline (schedule.h): the micro-step loop of one step without pipeline
// stages, and its forward-only evaluation; the per-row loss sums every
// schedule's evaluation shares.
#include "engine/parallel/schedule.h"

#include "common/timeline.h"
#include "engine/comm/round_abort.h"
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
      // A round the agent ended: leave now, not at the step's next wait.
      comm::throw_if_round_aborted("the step's forward");
      comm::trace_phase(trace::Phase::forward);
      {
        timeline::Scope span(timeline::Kind::forward, micro);
        AutocastScope autocast(type, options.bf16);
        loss = parts.model->loss(inputs_, targets_);  // [] fp32 mean over B*T
      }
      comm::throw_if_round_aborted("the step's backward");
      comm::trace_phase(trace::Phase::backward);
      {
        timeline::Scope span(timeline::Kind::backward, micro);
        loss.mul(options.loss_scale).backward();
      }
      loss_sum += loss.item<double>();
    }
    return loss_sum;
  }
  EvalSums evaluate(ModelParts& parts, BatchSource& batches, const EvalOptions& options) override {
    model::GptImpl& model = *parts.model;
    EvalSums sums;
    for (int micro = 0; micro < int(options.rows.size()); ++micro) {
      batches.micro_batch(micro, inputs_, targets_);  // [B, T] each
      AutocastScope autocast(inputs_.device().type(), options.bf16);
      const at::Tensor x = model.run_blocks(model.embed(inputs_), 0, model.config().layers);  // [B, T, C]
      sums += head_loss_rows(model, x, targets_, options.rows[size_t(micro)]);
    }
    return sums;
  }
  const char* name() const override { return "none (micro-step loop)"; }

 private:
  at::Tensor inputs_, targets_;
};

}  // namespace

EvalSums head_loss_rows(model::GptImpl& model, const at::Tensor& x, const at::Tensor& targets, int rows) {
  EvalSums sums;
  const int64_t tokens = targets.size(1);
  for (int r = 0; r < rows; ++r) {
    const double mean = model.head_loss(x.narrow(0, r, 1), targets.narrow(0, r, 1)).item<double>();
    sums.loss_sum += mean * double(tokens);
    sums.tokens += double(tokens);
  }
  if (model.tensor_parallel().rank != 0) return {};  // the same numbers on every tp rank: counted once
  return sums;
}

std::unique_ptr<Schedule> make_no_pipeline() { return std::make_unique<NoPipeline>(); }

}  // namespace dtrain::engine::parallel
