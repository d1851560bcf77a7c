// Context parallelism as a layout of the model (docs/ARCHITECTURE.md, 'How
// to add a parallelism'): each rank of the cp group keeps two chunks of
// every sequence (cp_layout.h), the model's position embeddings and dropout
// masks follow their global positions, and attention runs as a ring over
// the group (ring_attention.h). Gradients are the same on every cp rank's
// replica and are reduced over dp x cp by the data-parallel sync.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "engine/comm/comm.h"
#include "engine/model/gpt.h"

namespace dtrain::engine::parallel::context {

// Turns the model's attention into ring attention over `cp` and its
// sequence into this rank's two chunks of seq_len tokens. local_only: the
// negative control (fault.kind cp_local_attention), each rank attending to
// its own chunks only. Nothing to do for a cp group of one rank.
void apply_context_parallel(model::GptImpl& model, comm::Group& cp, int64_t seq_len, bool local_only);

// This rank's chunks of a micro-batch's inputs and targets ([B, T] ->
// [B, T / cp], global order kept inside each chunk).
void take_local_tokens(at::Tensor& inputs, at::Tensor& targets, int cp, int rank);

}  // namespace dtrain::engine::parallel::context
