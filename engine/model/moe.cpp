// The MoE layer of moe.h: routing (softmax, top-k, capacity, Switch aux
// loss), dispatch and combine (local, or an uneven all-to-all over the EP
// group with the counts exchanged first), and the GPT's MoE accessors. Not the
// gradient synchronisation of experts (parallel/expert/ owns that).
//
// Shape legend: N = tokens of the micro-batch (B * T), C = d_model, E =
// experts, K = top_k, M = kept assignments, R = rows this rank's experts get,
// S = TP ranks sharing the tokens, Ns = N / S tokens of this rank's share.
#include "engine/model/moe.h"

#include "engine/model/gpt.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace dtrain::engine::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> to_vector(const at::Tensor& t) {  // int64 tensor -> host vector
  at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// The uneven all-to-all as an autograd function: backward sends each
// gradient row back to where its row came from (the same exchange with the
// splits swapped). Every EP rank runs both directions in the same order, so
// the collectives match (a rank with no rows still takes part).
struct AllToAll : public torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& in, const EpGroup* ep,
                            std::vector<int64_t> out_splits, std::vector<int64_t> in_splits) {
    ctx->saved_data["ep"] = reinterpret_cast<int64_t>(ep);
    ctx->saved_data["out_splits"] = out_splits;
    ctx->saved_data["in_splits"] = in_splits;
    at::Tensor out = at::empty({sum(out_splits), in.size(1)}, in.options());  // [sum out_splits, C]
    ep->all_to_all(in.contiguous(), out, out_splits, in_splits);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* ep = reinterpret_cast<const EpGroup*>(ctx->saved_data["ep"].toInt());
    std::vector<int64_t> out_splits = ctx->saved_data["out_splits"].toIntVector();
    std::vector<int64_t> in_splits = ctx->saved_data["in_splits"].toIntVector();
    at::Tensor g = grads[0].contiguous();
    at::Tensor back = at::empty({sum(in_splits), g.size(1)}, g.options());
    ep->all_to_all(g, back, in_splits, out_splits);
    return {back, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Under TP (Megatron's scatter / gather over the model-parallel region):
// the TP ranks hold the same tokens and the same gradients of them, so this
// rank's share is a slice forward, and the share's gradient is all-gathered
// back to the full [N, C] backward.
struct SplitShare : public torch::autograd::Function<SplitShare> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const TpGroup* tp) {  // [N, C] -> [Ns, C]
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    const int64_t ns = x.size(0) / tp->size;
    return x.narrow(0, tp->rank * ns, ns).clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* tp = reinterpret_cast<const TpGroup*>(ctx->saved_data["tp"].toInt());
    at::Tensor g = grads[0].contiguous();                                          // [Ns, C]
    at::Tensor full = at::empty({g.size(0) * tp->size, g.size(1)}, g.options());  // [N, C]
    tp->all_gather(g, full);
    return {full, at::Tensor()};
  }
};

// The expert outputs of every share, all-gathered: [K, Ns, C] -> [K, N, C];
// backward keeps this rank's share of the (replicated) gradient.
struct GatherShares : public torch::autograd::Function<GatherShares> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& s, const TpGroup* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    const int64_t K = s.size(0), ns = s.size(1), C = s.size(2), S = tp->size;
    at::Tensor all = at::empty({S * K, ns, C}, s.options());  // [S * K, Ns, C]
    tp->all_gather(s.contiguous(), all);
    return all.view({S, K, ns, C}).permute({1, 0, 2, 3}).reshape({K, S * ns, C});
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* tp = reinterpret_cast<const TpGroup*>(ctx->saved_data["tp"].toInt());
    const at::Tensor& g = grads[0];  // [K, N, C]
    const int64_t K = g.size(0), S = tp->size, ns = g.size(1) / S, C = g.size(2);
    return {g.reshape({K, S, ns, C}).select(1, tp->rank).contiguous(), at::Tensor()};
  }
};

// [B, T/S, C] -> [B, T, C]: every TP rank's positions, gathered along T.
at::Tensor gather_seq(const at::Tensor& x, const TpGroup& tp) {
  at::Tensor in = x.transpose(0, 1).contiguous();  // [T/S, B, C]: dim-0 collectives
  at::Tensor out = at::empty({in.size(0) * tp.size, in.size(1), in.size(2)}, in.options());  // [T, B, C]
  tp.all_gather(in, out);
  return out.transpose(0, 1).contiguous();  // [B, T, C]
}

// Sequence parallelism: gather_seq as an autograd function. The layer's
// output is the same on every TP rank and its gradient arrives whole
// (SliceSeq's backward), so the gradient of the gathered tokens is whole
// too: backward keeps this rank's positions of it (no reduce-scatter).
struct GatherSeq : public torch::autograd::Function<GatherSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const TpGroup* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    return gather_seq(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* tp = reinterpret_cast<const TpGroup*>(ctx->saved_data["tp"].toInt());
    const int64_t t = grads[0].size(1) / tp->size;
    return {grads[0].narrow(1, tp->rank * t, t).contiguous(), at::Tensor()};
  }
};

// [B, T, C] (the same on every TP rank) -> this rank's [B, T/S, C]; the
// gradient of the whole is every rank's positions all-gathered.
struct SliceSeq : public torch::autograd::Function<SliceSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const TpGroup* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    const int64_t t = y.size(1) / tp->size;
    return y.narrow(1, tp->rank * t, t).contiguous();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* tp = reinterpret_cast<const TpGroup*>(ctx->saved_data["tp"].toInt());
    return {gather_seq(grads[0].contiguous(), *tp), at::Tensor()};
  }
};

}  // namespace

int64_t moe_capacity(int64_t tokens, const MoeConfig& cfg) {
  const double c = std::ceil(double(tokens) * cfg.top_k * cfg.capacity_factor / cfg.experts);
  return std::max<int64_t>(1, int64_t(c));
}

Routing moe_route(const at::Tensor& logits, const MoeConfig& cfg, const at::Tensor& selection_bias) {
  const int64_t N = logits.size(0), E = cfg.experts, K = cfg.top_k;
  Routing r;
  r.probs = at::softmax(logits.to(at::kFloat), -1);  // [N, E]
  at::Tensor scores = r.probs.detach();
  if (cfg.bias_balance && selection_bias.defined()) scores = scores + selection_bias;  // choosing only
  r.experts = std::get<1>(at::topk(scores, K, /*dim=*/-1));  // [N, K], best first
  r.gates = r.probs.gather(1, r.experts);                    // [N, K]
  // Renormalised over the chosen k; top-1 keeps the probability itself
  // (Switch), else the gate would be 1 and the router would learn only from
  // the aux loss.
  // Mixtral renormalises always.
  if (K > 1 || cfg.llama) r.gates = r.gates / r.gates.sum(-1, /*keepdim=*/true);
  // Priority: all first choices (in token order), then all second choices.
  at::Tensor flat = r.experts.t().reshape({-1});                     // [K*N]
  at::Tensor onehot = at::one_hot(flat, E);                          // [K*N, E]
  at::Tensor position = (onehot.cumsum(0) * onehot).sum(1) - 1;      // [K*N] place in its expert's queue
  r.capacity = moe_capacity(N, cfg);
  r.keep = position < r.capacity;                                    // [K*N]
  r.load = onehot.sum(0);                                            // [E]
  // Switch Transformer: alpha * E * sum_i f_i P_i, f_i the fraction of the
  // N*K assignments to expert i (before capacity), P_i its mean probability.
  at::Tensor f = r.load.to(at::kFloat) / double(N * K);             // [E]
  r.aux = cfg.aux_loss_coef * double(E) * (f * r.probs.mean(0)).sum();  // []
  return r;
}

ExpertLinearImpl::ExpertLinearImpl(int experts, int in, int out, bool with_bias) {
  weight = register_parameter("weight", at::empty({experts, out, in}));  // [E, out, in]
  if (with_bias) bias = register_parameter("bias", at::zeros({experts, out}));  // [E, out]
}

MoeImpl::MoeImpl(const MoeConfig& cfg, int d_model) : cfg_(cfg) {
  if (cfg.experts < 1 || cfg.top_k < 1 || cfg.top_k > cfg.experts || !(cfg.capacity_factor > 0))
    throw Error(ErrorCode::config, "model.moe: experts " + std::to_string(cfg.experts) + ", top_k " +
                                       std::to_string(cfg.top_k) + ": need 1 <= top_k <= experts and capacity_factor > 0");
  router = register_module("router", torch::nn::Linear(torch::nn::LinearOptions(d_model, cfg.experts).bias(false)));
  const int d_ff = cfg.d_ff > 0 ? cfg.d_ff : 4 * d_model;
  const int built = cfg.local_experts > 0 ? cfg.local_experts : cfg.experts;
  fc = register_module("fc", ExpertLinear(built, d_model, cfg.llama ? 2 * d_ff : d_ff, !cfg.llama));
  proj = register_module("proj", ExpertLinear(built, d_ff, d_model, !cfg.llama));
  selection_bias = at::zeros({cfg.experts});
  counters.reset(cfg.experts);
}

at::Tensor MoeImpl::run_experts(const at::Tensor& rows, const std::vector<int64_t>& counts) {
  std::vector<at::Tensor> outs;
  int64_t off = 0;
  for (size_t j = 0; j < counts.size(); ++j) {
    if (counts[j] == 0) continue;
    at::Tensor x = rows.narrow(0, off, counts[j]);  // [n, C]
    const int64_t e = int64_t(j);  // local index into this rank's slice
    if (cfg_.llama) {  // SwiGLU, no biases
      outs.push_back(at::linear(swiglu(at::linear(x, fc->weight[e])), proj->weight[e]));  // [n, C]
    } else {
      at::Tensor h = at::gelu(at::linear(x, fc->weight[e], fc->bias[e]));  // [n, F]
      outs.push_back(at::linear(h, proj->weight[e], proj->bias[e]));      // [n, C]
    }
    off += counts[j];
  }
  // No rows: an empty slice of the input keeps the graph (and so the
  // backward all-to-all) connected on this rank.
  return outs.empty() ? rows.narrow(0, 0, 0) : at::cat(outs, 0);  // [sum counts, C]
}

at::Tensor MoeImpl::forward(const at::Tensor& x_in) {
  // Sequence parallelism: the TP group's positions gathered first, so every
  // TP rank holds the whole micro-batch (as without SP) and routing and
  // capacity are one process's; this rank's positions of the (replicated)
  // output are returned at the end.
  const bool sp = tp && tp->sp();
  const at::Tensor x = sp ? GatherSeq::apply(x_in, tp) : x_in;  // [B, T, C]
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), N = B * T;
  const int64_t E = cfg_.experts, K = cfg_.top_k;
  at::Tensor xf = x.reshape({N, C});                                 // [N, C]
  if (selection_bias.device() != x.device()) selection_bias = selection_bias.to(x.device());
  // The routing of all N tokens (the same on every TP rank: the same tokens).
  Routing r = moe_route(router->forward(xf), cfg_, selection_bias);
  last_aux = r.aux;
  const bool shared = tp && tp->active();
  const int64_t S = shared ? tp->size : 1, Ns = N / S, t0 = shared ? tp->rank * Ns : 0;
  if (N % S != 0)
    throw Error(ErrorCode::internal, "MoE under tensor parallelism: " + std::to_string(N) +
                                         " tokens of a micro-batch do not split over tp = " + std::to_string(S));

  // This rank's kept assignments (of its share's tokens) sorted by
  // (expert, priority): a = j * N + n.
  at::Tensor flat = r.experts.t().reshape({-1});                     // [K*N]
  at::Tensor mine = r.keep;                                          // [K*N]
  if (shared) {
    at::Tensor n = at::remainder(at::arange(K * N, flat.options()), N);  // [K*N] token of each assignment
    mine = mine.logical_and(n >= t0).logical_and(n < t0 + Ns);
  }
  at::Tensor kept = mine.nonzero().squeeze(1);                       // [M] ascending a
  at::Tensor kept_e = flat.index_select(0, kept);                    // [M]
  at::Tensor order = std::get<1>(at::sort(kept_e * (K * N) + kept)); // unique keys: a deterministic order
  at::Tensor sorted_a = kept.index_select(0, order);                 // [M]
  at::Tensor sorted_e = kept_e.index_select(0, order);               // [M]
  at::Tensor xs = shared ? SplitShare::apply(xf, tp) : xf;           // [Ns, C]
  at::Tensor send = xs.index_select(0, at::remainder(sorted_a, N) - t0);  // [M, C]
  std::vector<int64_t> counts = to_vector(at::bincount(sorted_e, {}, E));  // [E]
  if (is_training()) {  // an evaluation's tokens move no selection bias and no load metric
    std::vector<int64_t> load = to_vector(r.load);
    for (size_t e = 0; e < load.size(); ++e) counters.load[e] += double(load[e]);
    counters.assigned += double(K * N);
    counters.dropped += double(K * N - r.keep.sum().item<int64_t>());
    counters.aux_sum += r.aux.item<double>();
    counters.forwards += 1;
  }

  at::Tensor back;  // [M, C] expert outputs in the order of `send`
  if (!ep || !ep->active()) {
    back = run_experts(send, counts);
  } else {
    const int64_t P = ep->size, L = E / P;  // L experts per rank
    // Counts first: rank s learns how many rows of each of its experts come from every rank.
    at::Tensor cnt = at::tensor(counts, at::TensorOptions().dtype(at::kLong)).to(x.device());  // [E]
    at::Tensor recv_cnt = at::empty({E}, cnt.options());             // [P, L] flattened
    ep->all_to_all(cnt, recv_cnt, std::vector<int64_t>(size_t(P), L), std::vector<int64_t>(size_t(P), L));
    std::vector<int64_t> rc = to_vector(recv_cnt);
    std::vector<int64_t> in_splits(size_t(P), 0), out_splits(size_t(P), 0), per_expert(size_t(L), 0);
    for (int64_t s = 0; s < P; ++s)
      for (int64_t j = 0; j < L; ++j) {
        in_splits[size_t(s)] += counts[size_t(s * L + j)];
        out_splits[size_t(s)] += rc[size_t(s * L + j)];
        per_expert[size_t(j)] += rc[size_t(s * L + j)];
      }
    at::Tensor recv = AllToAll::apply(send, ep, out_splits, in_splits);  // [R, C] by source, then expert
    // Group the received rows by local expert (source order within one).
    std::vector<int64_t> perm;
    std::vector<int64_t> start(size_t(P), 0);
    for (int64_t s = 1; s < P; ++s) start[size_t(s)] = start[size_t(s - 1)] + out_splits[size_t(s - 1)];
    for (int64_t j = 0; j < L; ++j)
      for (int64_t s = 0; s < P; ++s) {
        int64_t off = start[size_t(s)];
        for (int64_t i = 0; i < j; ++i) off += rc[size_t(s * L + i)];
        for (int64_t i = 0; i < rc[size_t(s * L + j)]; ++i) perm.push_back(off + i);
      }
    at::Tensor perm_t = at::tensor(perm, at::TensorOptions().dtype(at::kLong)).to(x.device());  // [R]
    at::Tensor out_grouped = run_experts(recv.index_select(0, perm_t), per_expert);
    at::Tensor inverse = at::empty_like(perm_t).scatter_(0, perm_t, at::arange(perm_t.numel(), perm_t.options()));
    back = AllToAll::apply(out_grouped.index_select(0, inverse), ep, in_splits, out_splits);  // [M, C]
  }
  // Combine: each assignment's output in its slot (of the share: j * Ns +
  // n - t0), the shares gathered, then the gated sum over the k choices in
  // a fixed order (the same whatever ep and tp).
  at::Tensor local_a = at::div(sorted_a, N, "floor") * Ns + at::remainder(sorted_a, N) - t0;  // [M]
  at::Tensor slots = at::zeros({K * Ns, C}, back.options()).index_copy(0, local_a, back);    // [K*Ns, C]
  if (shared) slots = GatherShares::apply(slots.view({K, Ns, C}), tp);                      // [K, N, C]
  at::Tensor y = (slots.view({K, N, C}) * r.gates.t().unsqueeze(-1).to(slots.scalar_type())).sum(0);  // [N, C]
  return sp ? SliceSeq::apply(y.view({B, T, C}), tp) : y.view({B, T, C});  // [B, T / S, C] with SP
}

void MoeImpl::update_selection_bias(const std::vector<double>& load, double rate) {
  double mean = 0;
  for (double l : load) mean += l / double(load.size());
  std::vector<float> step;
  for (double l : load) step.push_back(float(rate * double((mean > l) - (mean < l))));
  at::NoGradGuard no_grad;
  selection_bias.add_(at::tensor(step).to(selection_bias.device()));
}

// ---------------------------------------------------------------------------
// The GPT's MoE accessors (declared in gpt.h).

std::vector<Moe> GptImpl::moe_layers() const {
  std::vector<Moe> out;
  for (const auto& block : *blocks)
    if (const auto& m = block->as<Block>()->moe) out.push_back(m);
  return out;
}

at::Tensor GptImpl::moe_aux_loss() const {
  at::Tensor total;
  for (const auto& m : moe_layers())
    if (m->last_aux.defined()) total = total.defined() ? total + m->last_aux : m->last_aux;
  return total;
}

void GptImpl::set_expert_parallel(EpGroup ep) {
  ep_ = std::move(ep);
  for (auto& m : moe_layers()) m->ep = &ep_, m->tp = &tp_;
}

}  // namespace dtrain::engine::model
