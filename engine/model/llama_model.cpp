// The Llama parts of gpt.h's modules (model.kind llama): the attention's
// q, k, v (this rank's heads, rotated at global positions). The numerics of
// RMSNorm, rotary and SwiGLU are llama.cpp's; the rest of the forward is
// shared with the GPT in gpt.cpp, the initialisation's rules live in
// param_init.cpp.
//
// Shape legend: B = batch, T = time, C = channels, H = local query heads,
// KVl = local kv heads, D = head dim.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "engine/model/gpt.h"
#include "engine/model/linear_ops.h"

namespace dtrain::engine::model {

using detail::linear_nd;
using detail::tp_input;

// llama: q from this rank's query heads, k and v from the kv heads they use
// (kv_first.. of the global numbering), rotated at their global positions.
std::vector<at::Tensor> CausalSelfAttentionImpl::llama_qkv(const at::Tensor& x, int64_t H) {
  const int64_t B = x.size(0), D = x.size(2) / heads, KVl = kv_local;
  const at::Tensor in = tp_input(x, tp);          // [B, T, C] (all T, also with sequence parallelism)
  const at::Tensor qo = linear_nd(in, q->weight);  // [B, T, H*D]
  at::Tensor w = kv->weight;                       // [2*KVl*D, C], or the whole [2*KV*D, C]
  if (kv_replicated)  // this rank's kv head: its k rows and its v rows of the whole weight
    w = at::cat({w.narrow(0, kv_first * D, KVl * D), w.narrow(0, (kv_heads + kv_first) * D, KVl * D)}, 0);
  const at::Tensor kvo = linear_nd(in, w);         // [B, T, 2*KVl*D]
  const int64_t T = qo.size(1);
  at::Tensor positions = at::arange(T, at::TensorOptions().dtype(at::kLong).device(x.device()));
  if (seq && seq->active()) {  // this rank's segments of the global sequence
    std::vector<at::Tensor> parts;
    for (auto [begin, end] : seq->segments) parts.push_back(at::arange(begin, end, positions.options()));
    positions = at::cat(parts, 0);
  }
  const auto& cs = rotary->cos_sin(positions);  // cos, sin [T, D]
  const auto heads_major = [&](const at::Tensor& t, int64_t n) {  // [B, T, n, D] -> [B*n, T, D]
    return t.permute({0, 2, 1, 3}).contiguous().view({B * n, T, D});
  };
  return {heads_major(apply_rotary(qo.view({B, T, H, D}), cs[0], cs[1]), H),
          heads_major(apply_rotary(kvo.narrow(2, 0, KVl * D).view({B, T, KVl, D}), cs[0], cs[1]), KVl),
          heads_major(kvo.narrow(2, KVl * D, KVl * D).view({B, T, KVl, D}), KVl)};
}

}  // namespace dtrain::engine::model
