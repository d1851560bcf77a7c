// A tied head (model.tie_embeddings) across pipeline stages: the first stage
// embeds with wte, the last stage's head reads its own copy of wte, and the
// two copies stay equal because each step both add the other's gradient
// before the optimizer (Megatron's embedding group of the first and last
// stage). Owns only that exchange; the copies' checkpointing and norm
// (the last stage's copy is neither written nor counted: its ParamLayout's
// tp_owner is false) are the GradSync's.
#pragma once

#include <memory>

#include "engine/comm/comm.h"
#include "engine/parallel/grad_sync.h"

namespace dtrain::engine::parallel {

// Wraps `inner` on a rank that holds a copy of wte.weight under pp > 1 (the
// first or the last pp stage): after inner's finish(), the gradient of its
// wte.weight (whole under DDP, this dp rank's shard pieces under ZeRO-1/2,
// laid out alike on both stages) is swapped with `peer` (the other end's
// index in `pp`) and summed, a + b on one end and b + a on the other: the
// same bits, so the same AdamW update keeps the copies equal.
// fault_skip (fault.kind no_grad_sync, whose gradient reductions do
// nothing): no swap, each copy keeps its own gradient.
std::unique_ptr<GradSync> make_tied_embedding_sync(std::unique_ptr<GradSync> inner, comm::Group& pp, int peer,
                                                   bool fault_skip);

}  // namespace dtrain::engine::parallel
