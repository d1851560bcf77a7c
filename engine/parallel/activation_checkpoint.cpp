// apply_activation_checkpointing (activation_checkpoint.h): installs the
// model's segment runners. The recomputation runs with the dropout position
// of its forward restored: a pipeline runs other micro-batches' forwards
// between a micro-batch's forward and its backward, and the layout-invariant
// masks are a function of that position only, so the recomputed forward is
// the original one bit for bit.
#include "engine/parallel/activation_checkpoint.h"

#include <memory>
#include <string>

#include "common/error.h"
#include "engine/model/recompute.h"

namespace dtrain::engine::parallel {
namespace {

model::SegmentRunner recompute_runner(model::GptImpl& model, bool redraw_fault) {
  return [&model, redraw_fault](model::Segment fn, const std::vector<at::Tensor>& inputs,
                                const std::vector<at::Tensor>& params) {
    model::DropoutPosition at_forward = model.dropout_position();
    if (redraw_fault) at_forward.step += 1;
    auto saved_now = std::make_shared<model::DropoutPosition>();
    auto around = [&model, at_forward, saved_now](bool before) {
      if (before) {
        *saved_now = model.dropout_position();
        model.set_dropout_position(at_forward);
      } else {
        model.set_dropout_position(*saved_now);
      }
    };
    return model::recompute_in_backward(std::move(fn), inputs, params, around);
  };
}

}  // namespace

void apply_activation_checkpointing(model::GptImpl& model, Recompute mode, bool redraw_fault) {
  if (mode == Recompute::none) return;
  if (mode == Recompute::full) {
    model.set_block_runner(recompute_runner(model, redraw_fault));
    return;
  }
  if (mode == Recompute::selective) {
    for (const auto& block : *model.blocks)
      block->as<model::Block>()->attn->core_runner = recompute_runner(model, redraw_fault);
    return;
  }
  throw Error(ErrorCode::internal, "train.recompute = " + std::to_string(static_cast<int>(mode)) + " is no Recompute");
}

}  // namespace dtrain::engine::parallel
