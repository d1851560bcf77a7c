// apply_context_parallel and take_local_tokens (context_parallel.h).
#include "engine/parallel/context/context_parallel.h"

#include "engine/parallel/context/cp_layout.h"
#include "engine/parallel/context/ring_attention.h"

namespace dtrain::engine::parallel::context {

void apply_context_parallel(model::GptImpl& model, comm::Group& cp, int64_t seq_len, bool local_only) {
  if (cp.size() == 1) return;
  check_cp_layout(seq_len, cp.size(), cp.rank());
  model::SequenceSplit split;
  split.global_len = seq_len;
  for (const ChunkRange& c : cp_chunks(seq_len, cp.size(), cp.rank())) split.segments.emplace_back(c.begin, c.end);
  RingOptions opt;
  opt.local_only = local_only;
  comm::Group* group = &cp;  // outlives the model: the Comm owns it
  split.attention = [group, opt](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t batch,
                                 const model::AttentionDropout& drop) {
    return ring_attention(q, k, v, batch, drop, *group, opt);
  };
  model.set_sequence_split(std::move(split));
}

void take_local_tokens(at::Tensor& inputs, at::Tensor& targets, int cp, int rank) {
  if (cp == 1) return;
  inputs = cp_local(inputs, 1, cp, rank).contiguous();
  targets = cp_local(targets, 1, cp, rank).contiguous();
}

}  // namespace dtrain::engine::parallel::context
