// The llama's tensors (gpt_params.h), as the Llama parameter table names
// them: no biases, no position table (rotary), RMSNorm weights, grouped-query
// attention (q [H*D, C], kv [2*KV*D, C]), a SwiGLU MLP (gate_up [2F, C],
// proj [C, F]), MoE blocks with a router [E, C] and SwiGLU experts stored
// [E, 2Fe, C] and [E, C, Fe]; the head absent when tied to wte.
// Legend: C = d_model, V = vocab, H = heads, KV = kv heads, D = C / H,
// F = ffn_hidden, Fe = an expert's hidden width, E = experts.
#include "plan/gpt_params.h"

#include <algorithm>

namespace dtrain::plan {

bool is_llama(const ModelSpec& m) { return m.kind == "llama"; }

std::vector<ParamTensor> llama_embedding_tensors(const ModelSpec& m) {
  return {{"wte.weight", m.vocab, m.d_model, TpSplit::vocab}};
}

std::vector<ParamTensor> llama_block_tensors(const ModelSpec& m, int64_t layer) {
  const int64_t c = m.d_model, h = std::max(1, m.heads), d = c / h, kv = m.effective_kv_heads();
  // Column-parallel q, kv and gate_up (rows split), row-parallel attn.proj
  // and mlp.proj (columns split); the norms whole.
  std::vector<ParamTensor> t = {{"ln1.weight", c, 1, TpSplit::whole},
                                {"attn.q.weight", h * d, c, TpSplit::tp},
                                {"attn.kv.weight", 2 * kv * d, c, TpSplit::kv},
                                {"attn.proj.weight", c, h * d, TpSplit::tp},
                                {"ln2.weight", c, 1, TpSplit::whole}};
  if (is_moe_block(m, layer)) {
    t.push_back({"moe.router.weight", m.moe.experts, c, TpSplit::whole});
    return t;
  }
  const int64_t f = m.effective_ffn_hidden();
  t.insert(t.end(), {{"mlp.gate_up.weight", 2 * f, c, TpSplit::tp}, {"mlp.proj.weight", c, f, TpSplit::tp}});
  return t;
}

std::vector<ParamTensor> llama_expert_tensors(const ModelSpec& m) {
  const int64_t c = m.d_model, f = expert_hidden(m);
  // One expert's slices of moe.fc.weight [E, 2Fe, C] and moe.proj.weight [E, C, Fe].
  return {{"moe.fc.weight", 2 * f, c}, {"moe.proj.weight", c, f}};
}

std::vector<ParamTensor> llama_head_tensors(const ModelSpec& m) {
  std::vector<ParamTensor> t = {{"ln_f.weight", m.d_model, 1, TpSplit::whole}};
  if (!m.tie_embeddings) t.push_back({"head.weight", m.vocab, m.d_model, TpSplit::vocab});
  return t;
}

}  // namespace dtrain::plan
