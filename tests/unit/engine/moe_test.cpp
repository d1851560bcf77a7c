// engine/model/moe: routing against hand-computed values (top-1 and top-2
// gates, capacity drops in priority order, the Switch aux loss), the layer
// against a per-token reference, expert parallelism over 2 and 4 ranks
// (threads with real Gloo groups) against one process, including a rank whose
// experts get no token and one that gets them all, tensor parallelism's token
// shares (tp 2) against one process, and the bias balance.
// Prints the max difference seen next to the tolerance.
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>

#include "engine/comm/comm.h"
#include "engine/model/moe.h"

#include "tests/support/thread_world.h"
#include "tests/support/torch_doctest.h"

namespace comm = dtrain::engine::comm;
using dtrain::engine::model::EpGroup;
using dtrain::engine::model::Moe;
using dtrain::engine::model::MoeConfig;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// A layer with seeded weights (the same numbers on every thread).
Moe make_layer(const MoeConfig& cfg, int C, uint64_t seed) {
  Moe m(cfg, C);
  auto gen = at::detail::createCPUGenerator(seed);
  at::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.normal_(0.0, 0.3, gen);
  return m;
}

// The layer's function token by token: sum over kept choices of gate * MLP_e(x).
at::Tensor reference(Moe& m, const at::Tensor& x) {
  const auto& cfg = m->config();
  const int64_t N = x.size(0) * x.size(1), C = x.size(2);
  at::Tensor xf = x.reshape({N, C});
  auto r = dtrain::engine::model::moe_route(m->router->forward(xf), cfg, m->selection_bias);
  at::Tensor y = at::zeros({N, C});
  for (int64_t j = 0; j < cfg.top_k; ++j)
    for (int64_t n = 0; n < N; ++n) {
      if (!r.keep[j * N + n].item<bool>()) continue;
      const int64_t e = r.experts[n][j].item<int64_t>();
      at::Tensor h = at::gelu(at::linear(xf[n], m->fc->weight[e], m->fc->bias[e]));
      y[n] += r.gates[n][j] * at::linear(h, m->proj->weight[e], m->proj->bias[e]);
    }
  return y.view({x.size(0), x.size(1), C});
}

// dp = ep = n: one ep group of everyone.
void run_world(int n, const std::function<void(comm::Comm&, int)>& fn) {
  dtrain::testing::run_world(dtrain::mesh::make_mesh(n, 1, 1, n), fn);
}

}  // namespace

TEST_CASE("moe: routing, capacity drops and the Switch aux loss by hand") {
  // probs rows: [.75 .25], [.25 .75], [.75 .25], [.75 .25]
  const double l3 = std::log(3.0);
  at::Tensor logits = at::tensor({l3, 0.0, 0.0, l3, l3, 0.0, l3, 0.0}, at::kFloat).view({4, 2});
  MoeConfig cfg;
  cfg.experts = 2;
  cfg.top_k = 1;
  cfg.capacity_factor = 1.0;
  cfg.aux_loss_coef = 0.01;
  auto r = dtrain::engine::model::moe_route(logits, cfg, {});
  // f = [3/4, 1/4], P = [0.625, 0.375]: aux = 0.01 * 2 * (0.75 * 0.625 + 0.25 * 0.375) = 0.01125
  const double aux = r.aux.item<double>();
  std::printf("moe aux loss top-1: %.9g (hand 0.01125), diff %.3g, tolerance 1e-7\n", aux, std::abs(aux - 0.01125));
  CHECK(std::abs(aux - 0.01125) < 1e-7);
  CHECK(r.capacity == 2);  // ceil(4 * 1 * 1.0 / 2)
  CHECK(at::equal(r.experts.squeeze(1), at::tensor({0, 1, 0, 0}, at::kLong)));
  CHECK(at::equal(r.keep.to(at::kLong), at::tensor({1, 1, 1, 0}, at::kLong)));  // token 3 is expert 0's third
  CHECK(max_diff(r.gates.squeeze(1), at::full({4}, 0.75)) < 1e-6);  // top-1: the probability itself
  CHECK(at::equal(r.load, at::tensor({3, 1}, at::kLong)));

  // top-2 of 2: every token takes both, f = [.5 .5]: aux = 0.01 * 2 * 0.5 * (0.625 + 0.375) = 0.01.
  cfg.top_k = 2;
  cfg.capacity_factor = 0.5;  // capacity ceil(4 * 2 * 0.5 / 2) = 2
  r = dtrain::engine::model::moe_route(logits, cfg, {});
  CHECK(std::abs(r.aux.item<double>() - 0.01) < 1e-7);
  CHECK(r.capacity == 2);
  // First choices (e0, e1, e0, e0) before second choices (e1, e0, e1, e1):
  // e0 keeps tokens 0 and 2, e1 token 1 then token 0's second choice.
  CHECK(at::equal(r.keep.to(at::kLong), at::tensor({1, 1, 1, 0, 1, 0, 0, 0}, at::kLong)));
  CHECK(max_diff(r.gates.sum(1), at::ones({4})) < 1e-6);  // renormalised over the two
  CHECK(max_diff(r.gates.select(1, 0), at::full({4}, 0.75)) < 1e-6);
}

TEST_CASE("moe: the layer equals its per-token definition, with and without drops") {
  for (int top_k : {1, 2})
    for (double cf : {8.0, 1.0, 0.5}) {
      MoeConfig cfg;
      cfg.experts = 4;
      cfg.top_k = top_k;
      cfg.capacity_factor = cf;
      Moe m = make_layer(cfg, 8, 7);
      auto gen = at::detail::createCPUGenerator(11);
      at::Tensor x = at::randn({3, 5, 8}, gen);  // [B, T, C]
      const double d = max_diff(m->forward(x), reference(m, x));
      std::printf("moe layer vs per-token reference (top_k %d, cf %.1f, dropped %.0f of %.0f): max diff %.3g, "
                  "tolerance 1e-5\n", top_k, cf, m->counters.dropped, m->counters.assigned, d);
      CHECK(d < 1e-5);
      if (cf == 0.5) CHECK(m->counters.dropped > 0);
      if (cf == 8.0) CHECK(m->counters.dropped == 0);
    }
}

// Each rank routes its own tokens; the experts are spread over the ranks.
// The outputs, the input gradients, the router gradient and every expert's
// gradient (summed over the ranks' losses) must equal one process's.
void check_expert_parallel(int P, int top_k, double cf, bool skewed) {
  MoeConfig cfg;
  cfg.experts = 4;
  cfg.top_k = top_k;
  cfg.capacity_factor = cf;
  const int C = 6;
  auto input = [&](int r) {
    auto gen = at::detail::createCPUGenerator(100 + uint64_t(r));
    at::Tensor x = at::randn({2, 4, C}, gen);
    return skewed ? x.abs() + 1.0 : x;  // skewed: every token prefers expert 0
  };
  auto skew = [&](Moe& m) {
    if (!skewed) return;
    at::NoGradGuard no_grad;
    m->router->weight.fill_(-1.0);
    m->router->weight[0].fill_(1.0);
  };
  auto weight = [&](int r) { return at::randn({2, 4, C}, at::detail::createCPUGenerator(200 + uint64_t(r))); };
  // One process: every rank's tokens through the whole layer, separately.
  Moe ref = make_layer(cfg, C, 5);
  skew(ref);
  std::vector<at::Tensor> ref_y, ref_gx;
  std::vector<at::Tensor> ref_router_g;
  for (int r = 0; r < P; ++r) {
    for (auto& p : ref->parameters()) p.mutable_grad() = at::Tensor();
    at::Tensor x = input(r).requires_grad_(true);
    at::Tensor y = ref->forward(x);
    (y * weight(r)).sum().backward();
    ref_y.push_back(y.detach());
    ref_gx.push_back(x.grad());
    ref_router_g.push_back(ref->router->weight.grad().clone());
  }
  // Expert gradients summed over the ranks' losses.
  for (auto& p : ref->parameters()) p.mutable_grad() = at::Tensor();
  for (int r = 0; r < P; ++r) (ref->forward(input(r)) * weight(r)).sum().backward();

  std::mutex mu;
  double worst = 0, received_min = 1e9, received_max = 0;
  run_world(P, [&](comm::Comm& c, int rank) {
    comm::Group& g = c.axis("ep");
    Moe m = make_layer(cfg, C, 5);
    skew(m);
    const int64_t L = cfg.experts / P;
    {
      at::NoGradGuard no_grad;
      for (auto* lin : {m->fc.get(), m->proj.get()}) {
        lin->weight.set_data(lin->weight.narrow(0, rank * L, L).contiguous());
        lin->bias.set_data(lin->bias.narrow(0, rank * L, L).contiguous());
      }
    }
    EpGroup ep;
    ep.rank = g.rank();
    ep.size = g.size();
    ep.all_to_all = [&g](const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& os,
                         const std::vector<int64_t>& is) { g.all_to_all(in, out, os, is); };
    m->ep = &ep;
    at::Tensor x = input(rank).requires_grad_(true);
    g.reset_bytes_sent();
    at::Tensor y = m->forward(x);
    (y * weight(rank)).sum().backward();
    double d = std::max({max_diff(y, ref_y[size_t(rank)]), max_diff(x.grad(), ref_gx[size_t(rank)]),
                         max_diff(m->router->weight.grad(), ref_router_g[size_t(rank)])});
    for (auto [mine, full] : {std::pair{m->fc.get(), ref->fc.get()}, {m->proj.get(), ref->proj.get()}}) {
      at::Tensor gw = mine->weight.grad().defined() ? mine->weight.grad() : at::zeros_like(mine->weight);
      at::Tensor gb = mine->bias.grad().defined() ? mine->bias.grad() : at::zeros_like(mine->bias);
      d = std::max({d, max_diff(gw, full->weight.grad().narrow(0, rank * L, L)),
                    max_diff(gb, full->bias.grad().narrow(0, rank * L, L))});
    }
    std::lock_guard<std::mutex> lock(mu);
    worst = std::max(worst, d);
    const double sent_rows = double(g.bytes_sent()) / (C * 4.0);
    received_min = std::min(received_min, sent_rows);
    received_max = std::max(received_max, sent_rows);
  });
  std::printf("moe ep %d (top_k %d, cf %.1f%s) vs one process: max diff %.3g (outputs, input, router and expert "
              "grads), tolerance 1e-5; rows sent per rank %.0f..%.0f\n",
              P, top_k, cf, skewed ? ", every token to expert 0" : "", worst, received_min, received_max);
  CHECK(worst < 1e-5);
}

TEST_CASE("moe: expert parallelism over 2 and 4 ranks equals one process") {
  check_expert_parallel(2, 1, 1.0, false);  // with drops
  check_expert_parallel(4, 2, 1.0, false);  // one expert per rank, top-2, with drops
  // All tokens to expert 0: rank 0 receives every row, the others none.
  check_expert_parallel(4, 1, 8.0, true);
  check_expert_parallel(2, 1, 8.0, true);
}

// Under TP every rank of the tp group holds the same tokens and dispatches
// its share: at tp 2 with ep 2 (the ep group is the tp group) and ep 1
// (every expert on both ranks, their gradients summed over edp), every rank's
// output, input gradient and router gradient equal one process's, and the
// expert gradients after the edp sum do too. Top-2, capacity 1.0 (drops).
void check_tp_shares(int ep_size) {
  MoeConfig cfg;
  cfg.experts = 4;
  cfg.top_k = 2;
  cfg.capacity_factor = 1.0;
  const int C = 6;
  const at::Tensor x0 = at::randn({2, 4, C}, at::detail::createCPUGenerator(300));
  const at::Tensor w = at::randn({2, 4, C}, at::detail::createCPUGenerator(301));
  Moe ref = make_layer(cfg, C, 7);
  at::Tensor rx = x0.clone().requires_grad_(true);
  at::Tensor ry = ref->forward(rx);
  (ry * w).sum().backward();
  std::mutex mu;
  double worst = 0;
  dtrain::testing::run_world(dtrain::mesh::make_mesh(1, 2, 1, ep_size), [&](comm::Comm& c, int rank) {
    comm::Group &t = c.axis("tp"), &g = c.axis("ep"), &edp = c.axis("edp");
    Moe m = make_layer(cfg, C, 7);
    const int64_t L = cfg.experts / g.size(), first = g.rank() * L;
    {
      at::NoGradGuard no_grad;
      for (auto* lin : {m->fc.get(), m->proj.get()}) {
        lin->weight.set_data(lin->weight.narrow(0, first, L).contiguous());
        lin->bias.set_data(lin->bias.narrow(0, first, L).contiguous());
      }
    }
    EpGroup ep;
    ep.rank = g.rank();
    ep.size = g.size();
    ep.all_to_all = [&g](const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& os,
                         const std::vector<int64_t>& is) { g.all_to_all(in, out, os, is); };
    dtrain::engine::model::TpGroup tp;
    tp.rank = t.rank();
    tp.size = t.size();
    tp.all_gather = [&t](const at::Tensor& in, at::Tensor& out) { t.all_gather(in, out); };
    m->ep = &ep;
    m->tp = &tp;
    at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor y = m->forward(x);
    (y * w).sum().backward();
    double d = std::max({max_diff(y, ry), max_diff(x.grad(), rx.grad()),
                         max_diff(m->router->weight.grad(), ref->router->weight.grad())});
    for (auto [mine, full] : {std::pair{m->fc.get(), ref->fc.get()}, {m->proj.get(), ref->proj.get()}})
      for (auto [a, b] : {std::pair{mine->weight, full->weight}, {mine->bias, full->bias}}) {
        at::Tensor ga = a.grad().defined() ? a.grad().clone() : at::zeros_like(a);
        edp.all_reduce(ga);
        d = std::max(d, max_diff(ga, b.grad().narrow(0, first, L)));
      }
    std::lock_guard<std::mutex> lock(mu);
    worst = std::max(worst, d);
  });
  std::printf("moe tp 2 token shares, ep %d (top_k 2, cf 1.0) vs one process: max diff %.3g (outputs, input, router "
              "and edp-summed expert grads), tolerance 1e-5\n",
              ep_size, worst);
  CHECK(worst < 1e-5);
}

TEST_CASE("moe: tensor parallelism's token shares (tp 2, ep 2 and ep 1) equal one process") {
  check_tp_shares(2);
  check_tp_shares(1);
}

TEST_CASE("moe: the selection bias (balance bias) evens a skewed router's load") {
  MoeConfig cfg;
  cfg.experts = 4;
  cfg.top_k = 1;
  cfg.capacity_factor = 4.0;
  auto run = [&](bool bias) {
    cfg.bias_balance = bias;
    Moe m = make_layer(cfg, 8, 3);
    {
      at::NoGradGuard no_grad;
      m->router->weight[0].add_(0.5);  // expert 0 is preferred by inputs with a positive mean
    }
    at::Tensor x = at::randn({8, 8, 8}, at::detail::createCPUGenerator(9)).abs() * 0.5 + 0.2;
    double first = 0, last = 0;
    for (int step = 0; step < 50; ++step) {
      m->counters.reset(cfg.experts);
      at::NoGradGuard no_grad;
      m->forward(x);
      const auto& load = m->counters.load;
      double mean = 0, top = 0;
      for (double l : load) mean += l / 4, top = std::max(top, l);
      (step == 0 ? first : last) = top / mean;
      if (bias) m->update_selection_bias(load, 0.02);
    }
    return std::pair{first, last};
  };
  auto [aux_first, aux_last] = run(false);
  auto [bias_first, bias_last] = run(true);
  std::printf("moe max load / mean over 50 steps: balance aux %.3f -> %.3f, balance bias %.3f -> %.3f\n", aux_first,
              aux_last, bias_first, bias_last);
  CHECK(aux_first > 2.0);  // the router is skewed
  CHECK(aux_last == aux_first);  // nothing moves without the bias (no training here)
  CHECK(bias_first == aux_first);
  CHECK(bias_last <= 0.5 * aux_last);  // the busiest expert takes at most half the share it had
}
