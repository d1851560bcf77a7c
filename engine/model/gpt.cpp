// The GPT of gpt.h: module construction in a fixed registration order, the
// deterministic seeded initialisation, and the forward pass (the attention
// core, naive or tiled, lives in attention_core.cpp and tiled_attention.cpp).
// Not parallel: TP/PP/EP wrap or re-lay these modules elsewhere.
//
// Shape legend: B = batch, T = time (sequence), C = channels (d_model),
// H = heads, D = head dim (C / H), V = vocabulary.
#include "engine/model/gpt.h"

#include "common/error.h"
#include "engine/model/fused_ops.h"
#include "engine/model/linear_ops.h"
#include "engine/random/philox.h"

#include <ATen/ATen.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

namespace dtrain::engine::model {

using detail::linear_nd;
using detail::tp_input;

namespace {

void check_config(const GptConfig& cfg) {
  if (cfg.vocab < 1 || cfg.layers < 1 || cfg.d_model < 1 || cfg.heads < 1 || cfg.seq_len < 1) {
    throw Error(ErrorCode::config,
                "model: vocab, layers, d_model, heads and seq_len must be >= 1 (vocab " +
                    std::to_string(cfg.vocab) + ", layers " + std::to_string(cfg.layers) +
                    ", d_model " + std::to_string(cfg.d_model) + ", heads " +
                    std::to_string(cfg.heads) + ", seq_len " + std::to_string(cfg.seq_len) + ")");
  }
  if (cfg.d_model % cfg.heads != 0) {
    throw Error(ErrorCode::config,
                "model.d_model = " + std::to_string(cfg.d_model) + " is not divisible by model.heads = " +
                    std::to_string(cfg.heads),
                "choose heads that divide d_model");
  }
  if (cfg.dropout < 0.0 || cfg.dropout >= 1.0) {
    throw Error(ErrorCode::config, "model.dropout = " + std::to_string(cfg.dropout) + " is outside [0, 1)");
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Attention

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& cfg) : heads(cfg.heads) {
  kind = attention_kind(cfg.attention);
  if (cfg.llama()) {  // separate q and kv (grouped-query attention), no biases
    const int D = cfg.d_model / cfg.heads;
    kv_heads = kv_local = cfg.kv();
    q = register_module("q", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.heads * D).bias(false)));
    kv = register_module("kv", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, 2 * kv_heads * D).bias(false)));
    proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(cfg.heads * D, cfg.d_model).bias(false)));
  } else {
    qkv = register_module("qkv", torch::nn::Linear(cfg.d_model, 3 * cfg.d_model));
    proj = register_module("proj", torch::nn::Linear(cfg.d_model, cfg.d_model));
  }
  attn_drop = register_module("attn_drop", torch::nn::Dropout(cfg.dropout));
  resid_drop = register_module("resid_drop", torch::nn::Dropout(cfg.dropout));
}

namespace {

// x W^T + b with W this rank's rows (column-parallel: the input is copied
// into the TP region, the output stays split).
// With sequence parallelism the input holds this rank's positions and is
// all-gathered along T first.
at::Tensor column_parallel(torch::nn::Linear& l, const at::Tensor& x, const TpGroup* tp) {
  return linear_nd(tp_input(x, tp), l->weight, l->bias);
}

// x W^T + b with W this rank's columns and x this rank's split input
// (row-parallel: partial products summed over TP, then the bias once).
// (with sequence parallelism: reduce-scattered along T instead).
at::Tensor row_parallel(torch::nn::Linear& l, const at::Tensor& x, const TpGroup* tp) {
  if (!tp || !tp->active()) return linear_nd(x, l->weight, l->bias);
  at::Tensor partial = linear_nd(x, l->weight);
  at::Tensor out;
  if (tp->fault_no_row_reduce)  // [B, T, C] or, with sequence parallelism, [B, T/tp, C] unsummed
    out = tp->sp() ? partial.narrow(1, tp->rank * (partial.size(1) / tp->size), partial.size(1) / tp->size).contiguous()
                   : partial;
  else
    out = tp->sp() ? scatter_to_sp(partial, *tp) : reduce_from_tp(partial, *tp);
  return l->bias.defined() ? out + l->bias : out;
}

}  // namespace

// Dropout whose mask is a function of each element's place in the global batch
// (docs/ARCHITECTURE.md, 'Layout-invariant randomness'): dim 0 is this
// micro-batch's rows of the global batch; split_dim (if any) is this rank's
// [split_begin, ...) of a global extent split_global (attention heads under TP).
at::Tensor invariant_dropout(const at::Tensor& x, double p, bool training, const DropoutPosition* pos,
                             int layer, random::DropoutSite site, int split_dim = -1,
                             int64_t split_global = 0, int64_t split_begin = 0) {
  if (!training || p == 0.0) return x;
  const DropoutPosition d = pos ? *pos : DropoutPosition{};
  std::vector<int64_t> global = x.sizes().vec();
  std::vector<std::pair<int64_t, int64_t>> slice;
  for (int64_t n : global) slice.emplace_back(0, n);
  if (d.global_rows > 0) {
    global[0] = d.global_rows;
    slice[0] = {d.row_begin, d.row_begin + x.size(0)};
  }
  if (split_dim >= 0) {
    global[size_t(split_dim)] = split_global;
    slice[size_t(split_dim)] = {split_begin, split_begin + x.size(split_dim)};
  }
  return random::layout_invariant_dropout(x, p, true, {d.seed, d.step, layer, site}, global, slice);
}

// Dropout of the residual stream [B, T, C]; with sequence parallelism x
// holds this rank's T / tp positions of it; with a sequence split (context
// parallelism) its segments of the global sequence, each masked at its
// global positions.
at::Tensor residual_dropout(const at::Tensor& x, double p, bool training, const DropoutPosition* pos,
                            int layer, random::DropoutSite site, const TpGroup* tp,
                            const SequenceSplit* seq = nullptr) {
  if (seq && seq->active() && training && p > 0.0) {
    std::vector<at::Tensor> parts;
    int64_t local = 0;
    for (auto [begin, end] : seq->segments) {
      parts.push_back(invariant_dropout(x.narrow(1, local, end - begin), p, training, pos, layer, site,
                                        /*split_dim=*/1, seq->global_len, begin));
      local += end - begin;
    }
    return at::cat(parts, 1);
  }
  if (!tp || !tp->sp()) return invariant_dropout(x, p, training, pos, layer, site);
  const int64_t t = x.size(1);
  return invariant_dropout(x, p, training, pos, layer, site, /*split_dim=*/1, t * tp->size, tp->rank * t);
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0);
  const int64_t tp_size = tp ? tp->size : 1;
  const int64_t H = heads / tp_size, D = x.size(2) / heads, C = H * D;  // local heads and width
  const double p = attn_drop->options.p();
  auto resid = [&](const at::Tensor& y) {  // [B, T, C] (full width after the row-parallel sum)
    return residual_dropout(row_parallel(proj, y, tp), p, is_training(), position, layer,
                            random::DropoutSite::attn_resid, tp, seq);
  };
  at::Tensor q, k, v;  // [B*H, T, D] (llama: k and v [B*KVl, T, D])
  if (this->q) {
    auto qkv3 = llama_qkv(x, H);
    q = qkv3[0], k = qkv3[1], v = qkv3[2];
  } else {
    auto qkv_out = column_parallel(qkv, x, tp);  // [B, T, 3C] (all T, also with sequence parallelism)
    // On the CPU without dropout, recomputation or a sequence split: the
    // naive core on strided views of qkv_out, no head-major copies.
    const bool split = seq && (seq->active() || seq->attention);
    if (kind == AttentionKind::naive && !core_runner && !split && !(is_training() && p > 0.0) &&
        strided_attention_applies(qkv_out))
      return resid(strided_attention(qkv_out, H, &causal_bias_));
    // Else one head-major copy of q, k and v together (matmul on the
    // strided [B, H, T, D] views would copy each of them anyway), then bmm.
    const int64_t T = qkv_out.size(1);
    auto qkv_heads = qkv_out.view({B, T, 3, H, D}).permute({2, 0, 3, 1, 4}).contiguous().view({3, B * H, T, D});
    // unbind, not three selects: its backward stacks the three grads in one
    // copy, where each select's backward would zero-fill all of [3, ...].
    auto qkv3 = qkv_heads.unbind(0);
    q = qkv3[0], k = qkv3[1], v = qkv3[2];  // [B*H, T, D] each
  }
  const int64_t T = q.size(1), KVl = k.size(0) / B;

  if (!x.device().is_cpu() && !(is_training() && p > 0.0) && !(seq && seq->active())) {
    // On a GPU: PyTorch's fused causal attention (FlashAttention-style
    // kernels), never materialising [B*H, T, T]. (With dropout on, the
    // explicit path below draws the layout-invariant mask.)
    auto y = at::scaled_dot_product_attention(q.view({B, H, T, D}), k.view({B, KVl, T, D}),
                                              v.view({B, KVl, T, D}), /*attn_mask=*/{}, 0.0,
                                              /*is_causal=*/true, std::nullopt,
                                              /*enable_gqa=*/KVl != H);  // [B, H, T, D]
    return resid(y.transpose(1, 2).reshape({B, T, C}));
  }
  // The core (scores, causal mask, softmax, dropout, weighted values),
  // naive or tiled (attention_core.h). It reads the dropout position and
  // the training flag when it runs, so a recomputation in backward (the
  // core_runner) draws the masks of the forward.
  const int64_t tp_rank = tp ? tp->rank : 0;
  Segment core = [this, B, H, tp_rank](const std::vector<at::Tensor>& qkv_in) {
    const DropoutPosition d = position ? *position : DropoutPosition{};
    AttentionDropout drop;
    drop.p = is_training() ? attn_drop->options.p() : 0.0;
    drop.key = {d.seed, d.step, layer, random::DropoutSite::attn_probs};
    drop.global_rows = d.global_rows > 0 ? d.global_rows : B;
    drop.row_begin = d.global_rows > 0 ? d.row_begin : 0;
    drop.heads_global = heads;
    drop.head_begin = tp_rank * H;
    if (seq && seq->attention)  // ring attention: grouped k, v as the cores take them
      return seq->attention(qkv_in[0], qkv_in[1], qkv_in[2], B, drop);
    return attention_core(kind, qkv_in[0], qkv_in[1], qkv_in[2], B, drop, &causal_bias_);
  };
  auto y = core_runner ? core_runner(core, {q, k, v}, {}) : core({q, k, v});  // [B*H, T, D]
  y = y.view({B, H, T, D}).transpose(1, 2).reshape({B, T, C});          // [B, T, C]
  return resid(y);
}

// ---------------------------------------------------------------------------
// MLP: exact (erf) GELU, as torch.nn.GELU() defaults to.

MlpImpl::MlpImpl(const GptConfig& cfg) {
  if (cfg.llama()) {  // SwiGLU: proj(silu(gate(x)) * up(x)), gate and up fused, no biases
    gate_up = register_module("gate_up", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, 2 * cfg.ffn()).bias(false)));
    proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(cfg.ffn(), cfg.d_model).bias(false)));
  } else {
    fc = register_module("fc", torch::nn::Linear(cfg.d_model, 4 * cfg.d_model));
    proj = register_module("proj", torch::nn::Linear(4 * cfg.d_model, cfg.d_model));
  }
  drop = register_module("drop", torch::nn::Dropout(cfg.dropout));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  // [B, T, 4C / tp]; SwiGLU: this rank's gate rows then its up rows, [B, T, F / tp]
  auto h = gate_up ? fused_swiglu(column_parallel(gate_up, x, tp))
                   : fused_linear_gelu(tp_input(x, tp), fc->weight, fc->bias);  // column-parallel fc, then GELU
  return residual_dropout(row_parallel(proj, h, tp), drop->options.p(), is_training(), position, layer,
                          random::DropoutSite::mlp_resid, tp, seq);  // [B, T, C] ([B, T / tp, C] with SP)
}

// ---------------------------------------------------------------------------
// Block (pre-LN)

BlockImpl::BlockImpl(const GptConfig& cfg, int layer) {
  // Registration order fixes both the parameter names' order and the order
  // in which GptImpl draws their initial values: ln1, attn, ln2, mlp.
  if (cfg.llama()) rms1 = register_module("ln1", RmsNorm(cfg.d_model, cfg.norm_eps));
  else ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
  attn = register_module("attn", CausalSelfAttention(cfg));
  if (cfg.llama()) rms2 = register_module("ln2", RmsNorm(cfg.d_model, cfg.norm_eps));
  else ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
  if (cfg.moe.is_moe_block(layer)) {
    MoeConfig m = cfg.moe;
    m.llama = cfg.llama();
    moe = register_module("moe", Moe(m, cfg.d_model));
  }
  else
    mlp = register_module("mlp", Mlp(cfg));
}

namespace {

NormParams norm_params(const torch::nn::LayerNorm& ln, const RmsNorm& rms) {
  if (rms) return {rms->weight, at::Tensor(), rms->eps, true};
  return {ln->weight, ln->bias, ln->options.eps(), false};
}

}  // namespace

// The norms run through fused_ops.h (ATen's ops outside fp32 CPU tensors).
at::Tensor BlockImpl::forward(const at::Tensor& x) {
  const at::Tensor a = attn->forward(fused_norm(x, norm_params(ln1, rms1)));  // [B, T, C]
  auto [h, n2] = fused_add_norm(x, a, norm_params(ln2, rms2));  // h = x + a and ln2(h) in one pass
  if (moe)  // the MLP's residual dropout on the experts' output
    return h + residual_dropout(moe->forward(n2), attn->resid_drop->options.p(), is_training(),
                                attn->position, attn->layer, random::DropoutSite::mlp_resid, attn->tp, attn->seq);
  return h + mlp->forward(n2);      // [B, T, C]
}

// ---------------------------------------------------------------------------
// GPT

// Deterministic init (param_init.h): one generator seeded with `seed`
// draws every parameter as soon as it is built, in registration order (the
// order named_parameters() lists them), so every process and every layout
// gets the same numbers, whichever parameters it keeps. The global
// generator is never used.
GptImpl::GptImpl(const GptConfig& cfg, uint64_t seed, const BuildScope& scope) : cfg_(cfg) {
  check_config(cfg);
  ParamInit init(seed, cfg.llama(), cfg.layers, scope.draw_threads);
  at::NoGradGuard no_grad;
  const auto place = [&](const std::string& prefix, torch::nn::Module& m) {
    for (auto& item : m.named_parameters(/*recurse=*/true)) build_param(prefix + item.key(), item.value(), init, scope);
  };
  wte = register_module("wte", torch::nn::Embedding(cfg.vocab, cfg.d_model));
  place("wte.", *wte);
  if (!cfg.llama()) {
    wpe = register_module("wpe", torch::nn::Embedding(cfg.seq_len, cfg.d_model));
    place("wpe.", *wpe);
  }
  rotary_.cfg = cfg.rope;
  rotary_.head_dim = cfg.d_model / cfg.heads;
  drop = register_module("drop", torch::nn::Dropout(cfg.dropout));
  blocks = register_module("blocks", torch::nn::ModuleList());
  GptConfig block_cfg = cfg;  // the experts this rank builds: E / ep of them
  if (scope.ep_size > 1) block_cfg.moe.local_experts = cfg.moe.experts / scope.ep_size;
  for (int i = 0; i < cfg.layers; ++i) {
    Block block(block_cfg, i);
    block->attn->layer = i;
    block->attn->position = &position_;
    block->attn->seq = &seq_;
    block->attn->rotary = &rotary_;
    if (block->mlp) block->mlp->layer = i, block->mlp->position = &position_, block->mlp->seq = &seq_;
    place("blocks." + std::to_string(i) + ".", *block);  // one block at a time: cut before the next is built
    blocks->push_back(block);
  }
  if (cfg.llama()) {
    rms_f = register_module("ln_f", RmsNorm(cfg.d_model, cfg.norm_eps));
    place("ln_f.", *rms_f);
  } else {
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    place("ln_f.", *ln_f);
  }
  // Untied from wte (GPT-2 ties them): keeps TP/PP sharding of the head
  // independent of the embedding's placement, at the cost of V*C parameters.
  // A llama may tie them (tie_embeddings): the head then reads wte.weight.
  if (!cfg.tie_embeddings) {
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab).bias(false)));
    place("head.", *head);
  }
}

// One parameter, just built: drawn (or skipped) and cut as `scope` says.
// Experts under expert parallelism were built as this rank's rows only.
void GptImpl::build_param(const std::string& name, at::Tensor& p, ParamInit& init, const BuildScope& scope) {
  const bool expert = scope.ep_size > 1 &&
                      (name.find(".moe.fc.") != std::string::npos || name.find(".moe.proj.") != std::string::npos);
  std::vector<int64_t> shape = p.sizes().vec();
  if (expert) shape[0] *= scope.ep_size;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  whole_params_ += n;
  if (scope.keeps && !scope.keeps(name)) {  // another stage's: only the generator moves
    if (scope.draw) init.skip(name, n);
    p.set_data(at::empty({0}, p.options()));
    return;
  }
  if (expert) {
    if (scope.draw) init.rows(name, p, n, int64_t(scope.ep_rank) * p.size(0));
    cut_shapes_[name] = shape;
    return;
  }
  if (scope.draw) init.whole(name, p);
  if (!scope.slice) return;
  at::Tensor local = scope.slice(name, p);
  if (local.is_same(p)) return;
  cut_shapes_[name] = shape;
  p.set_data(local);
}

std::vector<int64_t> GptImpl::whole_shape(const std::string& name, const at::Tensor& local) const {
  auto it = cut_shapes_.find(name);
  return it == cut_shapes_.end() ? local.sizes().vec() : it->second;
}

at::Tensor GptImpl::forward(const at::Tensor& tokens) {
  return head_logits(run_blocks(embed(tokens), 0, cfg_.layers));
}

at::Tensor GptImpl::embed(const at::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  if (T > cfg_.seq_len) {
    throw Error(ErrorCode::internal, "gpt: sequence of " + std::to_string(T) +
                                         " tokens exceeds model.seq_len = " + std::to_string(cfg_.seq_len));
  }
  // wpe(arange(T)) is the first T rows of the table: a narrow view gives the
  // same values and the same gradient without the gather and its backward.
  return run_unit(0, [&] {
    const int64_t vocab_begin = tp_.rank * wte->weight.size(0);
    at::Tensor tok = tp_.vocab_parallel ? vocab_parallel_embedding(tokens, wte->weight, vocab_begin, tp_)
                                        : at::embedding(wte->weight, tokens);  // [B, T, C]
    const int64_t t = tok.size(1);  // T / tp with sequence parallelism: this rank's positions
    if (!wpe)  // llama: positions enter as rotations of q and k
      return residual_dropout(tok, drop->options.p(), is_training(), &position_, 0, random::DropoutSite::embedding,
                              &tp_, &seq_);
    const int64_t t0 = tp_.sp() ? tp_.rank * t : 0;
    at::Tensor pos = wpe->weight.narrow(0, t0, t);  // [T, C]
    if (seq_.active()) {  // this rank's segments of the global positions
      std::vector<at::Tensor> rows;
      for (auto [begin, end] : seq_.segments) rows.push_back(wpe->weight.narrow(0, begin, end - begin));
      pos = at::cat(rows, 0);
    }
    return residual_dropout(tok + pos, drop->options.p(), is_training(), &position_, 0,
                            random::DropoutSite::embedding, &tp_, &seq_);  // [B, T, C] (+ [T, C] broadcast)
  });
}

at::Tensor GptImpl::run_blocks(const at::Tensor& x, int first, int last) {
  if (first < 0 || last > cfg_.layers || first > last)
    throw Error(ErrorCode::internal, "gpt: blocks [" + std::to_string(first) + ", " + std::to_string(last) +
                                         ") outside [0, " + std::to_string(cfg_.layers) + ")");
  at::Tensor h = x;
  for (int i = first; i < last; ++i)  // block i is unit i + 1
    h = run_unit(i + 1, [&] { return run_block(i, h); });  // [B, T, C]
  return h;
}

at::Tensor GptImpl::run_block(int i, const at::Tensor& x) {
  BlockImpl* block = blocks[size_t(i)]->as<Block>();
  if (!block_runner_) return block->forward(x);
  std::vector<at::Tensor> params = block->parameters(/*recurse=*/true);
  return block_runner_([block](const std::vector<at::Tensor>& in) { return block->forward(in[0]); }, {x}, params);
}

at::Tensor GptImpl::final_norm(const at::Tensor& x) { return fused_norm(x, norm_params(ln_f, rms_f)); }

at::Tensor GptImpl::head_logits(const at::Tensor& x) {
  return run_unit(cfg_.layers + 1, [&] {
    // Tied: wte's rows are the head's (split alike under vocab parallelism).
    const at::Tensor& w = head ? head->weight : wte->weight;  // [V, C] ([V / tp, C])
    if (!tp_.vocab_parallel) return head ? head->forward(final_norm(x)) : linear_nd(final_norm(x), w);  // [B, T, V]
    return linear_nd(tp_input(final_norm(x), &tp_), w);           // [B, T, V / tp]
  });
}

void GptImpl::set_tensor_parallel(TpGroup tp) {
  tp_ = std::move(tp);
  const int n = tp_.size, kv = cfg_.kv();
  for (const auto& block : *blocks) {
    auto& attn = block->as<Block>()->attn;
    if (attn->q) {  // the kv heads this rank's query heads [r H/n, (r+1) H/n) use
      attn->kv_replicated = kv % n != 0;  // then n % kv == 0: one kv head per rank
      attn->kv_local = attn->kv_replicated ? 1 : kv / n;
      attn->kv_first = attn->kv_replicated ? tp_.rank * kv / n : tp_.rank * attn->kv_local;
    }
    block->as<Block>()->attn->tp = &tp_;
    if (block->as<Block>()->mlp) block->as<Block>()->mlp->tp = &tp_;
  }
}

at::Tensor GptImpl::run_unit(int unit, const std::function<at::Tensor()>& body) {
  if (!hooks_) return body();
  hooks_->before(unit);
  return hooks_->after(unit, body());
}

int GptImpl::unit_of(const std::string& name) const {
  if (name.rfind("wte.", 0) == 0 || name.rfind("wpe.", 0) == 0) return 0;
  if (name.rfind("ln_f.", 0) == 0 || name.rfind("head.", 0) == 0) return cfg_.layers + 1;
  if (name.rfind("blocks.", 0) == 0) {
    const int layer = std::atoi(name.c_str() + 7);
    if (layer >= 0 && layer < cfg_.layers) return layer + 1;
  }
  throw Error(ErrorCode::internal, "gpt: parameter " + name + " belongs to no unit");
}

at::Tensor GptImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  at::Tensor l = head_loss(run_blocks(embed(tokens), 0, cfg_.layers), targets);
  return cfg_.moe.experts > 0 ? l + moe_aux_loss() : l;  // the MoE layers' aux losses join the loss
}

at::Tensor GptImpl::head_loss(const at::Tensor& x, const at::Tensor& targets) {
  auto logits = head_logits(x);  // [B, T, V / tp]
  if (tp_.active() && tp_.vocab_parallel)
    return vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                                        tp_.rank * logits.size(-1), tp_);
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

int64_t GptImpl::num_params() const {
  int64_t n = 0;
  for (const auto& p : parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

}  // namespace dtrain::engine::model
