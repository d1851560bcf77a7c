// The GPT's tensors (gpt_params.h). Legend: C = d_model, V = vocab,
// T = seq_len, E = experts, F = an expert's hidden width. A dense block is
// ln1 2C, qkv 3C*C+3C, attn proj C*C+C, ln2 2C, fc 4C*C+4C, mlp proj
// 4C*C+C = 12C^2 + 13C; a MoE block trades the MLP (8C^2 + 5C) for a
// router C*E (no bias) and E experts of fc F*C+F and proj C*F+C.
#include "plan/gpt_params.h"

#include <algorithm>

namespace dtrain::plan {

TpView tp_view(const JobSpec& spec) {
  TpView v;
  v.tp = std::max(1, spec.parallel.tp);
  v.vocab_parallel = v.tp > 1 && spec.model.tp_vocab == TpVocab::parallel;
  v.kv_heads = std::max(1, spec.model.effective_kv_heads());
  return v;
}

std::vector<ParamTensor> embedding_tensors(const ModelSpec& m) {
  if (is_llama(m)) return llama_embedding_tensors(m);
  return {{"wte.weight", m.vocab, m.d_model, TpSplit::vocab}, {"wpe.weight", m.seq_len, m.d_model, TpSplit::whole}};
}

std::vector<ParamTensor> block_tensors(const ModelSpec& m, int64_t layer) {
  if (is_llama(m)) return llama_block_tensors(m, layer);
  const int64_t c = m.d_model;
  // Column-parallel qkv and fc (rows and biases split), row-parallel
  // attn.proj and mlp.proj (columns split, biases whole).
  std::vector<ParamTensor> t = {
      {"ln1.weight", c, 1, TpSplit::whole},          {"ln1.bias", c, 1, TpSplit::whole},
      {"attn.qkv.weight", 3 * c, c, TpSplit::tp},    {"attn.qkv.bias", 3 * c, 1, TpSplit::tp},
      {"attn.proj.weight", c, c, TpSplit::tp},       {"attn.proj.bias", c, 1, TpSplit::whole},
      {"ln2.weight", c, 1, TpSplit::whole},          {"ln2.bias", c, 1, TpSplit::whole}};
  if (is_moe_block(m, layer)) {
    t.push_back({"moe.router.weight", m.moe.experts, c, TpSplit::whole});
    return t;
  }
  t.insert(t.end(), {{"mlp.fc.weight", 4 * c, c, TpSplit::tp},
                     {"mlp.fc.bias", 4 * c, 1, TpSplit::tp},
                     {"mlp.proj.weight", c, 4 * c, TpSplit::tp},
                     {"mlp.proj.bias", c, 1, TpSplit::whole}});
  return t;
}

std::vector<ParamTensor> expert_tensors(const ModelSpec& m) {
  if (is_llama(m)) return llama_expert_tensors(m);
  const int64_t c = m.d_model, f = expert_hidden(m);
  // The engine stores all E experts of a block as [E, out, in] (moe.fc.weight...); one expert's slice.
  return {{"moe.fc.weight", f, c}, {"moe.fc.bias", f, 1}, {"moe.proj.weight", c, f}, {"moe.proj.bias", c, 1}};
}

std::vector<ParamTensor> head_tensors(const ModelSpec& m) {
  if (is_llama(m)) return llama_head_tensors(m);
  return {{"ln_f.weight", m.d_model, 1, TpSplit::whole},
          {"ln_f.bias", m.d_model, 1, TpSplit::whole},
          {"head.weight", m.vocab, m.d_model, TpSplit::vocab}};  // no bias
}

bool is_moe_block(const ModelSpec& m, int64_t layer) {
  return m.moe.experts > 0 && layer % std::max(1, m.moe.every) == 0;
}

int64_t moe_block_count(const ModelSpec& m) {
  if (m.moe.experts <= 0 || m.layers <= 0) return 0;
  const int64_t every = std::max(1, m.moe.every);
  return (int64_t(m.layers) + every - 1) / every;  // blocks 0, every, 2 every, ...
}

int64_t expert_hidden(const ModelSpec& m) { return m.moe.d_ff > 0 ? m.moe.d_ff : 4 * int64_t(m.d_model); }

int64_t rank_numel(const std::vector<ParamTensor>& tensors, const TpView& view) {
  int64_t n = 0;
  for (const ParamTensor& t : tensors) {
    const bool split = t.split == TpSplit::tp || (t.split == TpSplit::vocab && view.vocab_parallel);
    n += t.rows * t.cols / (t.split == TpSplit::kv ? view.kv_divisor() : split ? view.tp : 1);
  }
  return n;
}

namespace {
double sum(const std::vector<ParamTensor>& ts) {
  double n = 0;
  for (const ParamTensor& t : ts) n += t.numel();
  return n;
}
double matrices(const std::vector<ParamTensor>& ts) {
  double n = 0;
  for (const ParamTensor& t : ts)
    if (t.cols > 1) n += t.numel();
  return n;
}
}  // namespace

double expert_numel(const ModelSpec& m) { return m.moe.experts > 0 ? sum(expert_tensors(m)) : 0.0; }

double block_matmul_numel(const ModelSpec& m, int64_t layer) {
  double n = matrices(block_tensors(m, layer));
  if (is_moe_block(m, layer)) n += double(std::max(1, m.moe.top_k)) * matrices(expert_tensors(m));
  return n;
}

ParamCount param_count(const ModelSpec& m) {
  ParamCount p;
  p.dense = sum(embedding_tensors(m)) + sum(head_tensors(m));
  // Two kinds of block, each counted once (closed form: the size limit
  // check reads this for any depth a spec asks for).
  const double moe_blocks = double(moe_block_count(m)), dense_blocks = double(m.layers) - moe_blocks;
  if (dense_blocks > 0) p.dense += dense_blocks * sum(block_tensors(m, m.moe.experts > 0 ? 1 : 0));
  if (moe_blocks > 0) {
    p.dense += moe_blocks * sum(block_tensors(m, 0));
    p.experts = moe_blocks * double(m.moe.experts) * expert_numel(m);
  }
  return p;
}

}  // namespace dtrain::plan
