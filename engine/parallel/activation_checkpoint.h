// Activation checkpointing (train.recompute), applied by parallelize after
// tensor parallelism and before data parallelism: full recomputes every block
// this rank holds in backward from its input; selective (Korthikanti et al.
// 2022) recomputes only each attention core (scores, softmax, dropout).
// Owns the choice of segments; the mechanism is model/recompute.h.
#pragma once

#include "common/spec_enums.h"
#include "engine/model/gpt.h"

namespace dtrain::engine::parallel {

// redraw_fault (fault.kind recompute_redraw):
// the recomputation draws its dropout masks from the next step's stream, a
// wrong recompute on purpose for the tests' negative control.
void apply_activation_checkpointing(model::GptImpl& model, Recompute mode, bool redraw_fault);

}  // namespace dtrain::engine::parallel
