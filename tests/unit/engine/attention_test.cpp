// Unit tests of the attention cores (engine/model/attention_core.h,
// tiled_attention.h) and of activation recomputation (model/recompute.h
// through parallel/activation_checkpoint.h): the tiled FlashAttention
// forward and backward against the naive core for T = 1, 7, 64, 257, 1024,
// 1 and 4 heads, with and without dropout, and TP-local heads; the strided
// core on a fused qkv against the naive core on its head-major copy; a GPT's
// loss and gradients with recompute full and selective against none. Each prints
// the max difference next to the tolerance, beside a control that must miss.
// Legend: BH = batch rows x heads, T = time, D = head dim.
#include "engine/model/attention_core.h"
#include "engine/model/gpt.h"
#include "engine/model/tiled_attention.h"
#include "engine/parallel/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "tests/support/torch_doctest.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

using namespace dtrain::engine;

namespace {

constexpr double kTol = 1e-5;

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item().toDouble(); }

struct CoreResult {
  at::Tensor out, dq, dk, dv;
};

CoreResult run_core(model::AttentionKind kind, const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0,
                    const at::Tensor& dout, int64_t batch, const model::AttentionDropout& drop) {
  at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
             v = v0.clone().requires_grad_(true);
  at::Tensor bias;
  at::Tensor out = model::attention_core(kind, q, k, v, batch, drop, &bias);
  auto g = torch::autograd::grad({out}, {q, k, v}, {dout});
  return {out.detach(), g[0], g[1], g[2]};
}

double worst(const CoreResult& a, const CoreResult& b) {
  return std::max({max_abs_diff(a.out, b.out), max_abs_diff(a.dq, b.dq), max_abs_diff(a.dk, b.dk),
                   max_abs_diff(a.dv, b.dv)});
}

model::AttentionDropout dropout_of(double p, int64_t batch, int64_t heads, int64_t heads_global = 0,
                                   int64_t head_begin = 0) {
  model::AttentionDropout d;
  d.p = p;
  d.key = {1234, 7, 1, random::DropoutSite::attn_probs};
  d.global_rows = batch + 3;  // this micro-batch is rows [2, 2 + batch) of a larger step batch
  d.row_begin = 2;
  d.heads_global = heads_global > 0 ? heads_global : heads;
  d.head_begin = head_begin;
  return d;
}

}  // namespace

TEST_CASE("tiled attention: forward and backward match the naive core (T 1..1024, heads 1 and 4, dropout 0 and 0.1)") {
  auto gen = at::detail::createCPUGenerator(42);
  for (int64_t T : {1, 7, 64, 257, 1024}) {
    for (int64_t H : {1, 4}) {
      for (double p : {0.0, 0.1}) {
        const int64_t B = T >= 257 ? 1 : 2, D = 8;
        at::Tensor q = at::randn({B * H, T, D}, gen), k = at::randn({B * H, T, D}, gen),
                   v = at::randn({B * H, T, D}, gen), dout = at::randn({B * H, T, D}, gen);  // [BH, T, D]
        const model::AttentionDropout drop = dropout_of(p, B, H);
        const CoreResult naive = run_core(model::AttentionKind::naive, q, k, v, dout, B, drop);
        const CoreResult tiled = run_core(model::AttentionKind::tiled, q, k, v, dout, B, drop);
        const double diff = worst(tiled, naive);
        std::string control_line;
        if (p > 0.0 && T > 1 && T <= 257) {
          // Control: masks from another step's stream must change the result by far.
          model::AttentionDropout other = drop;
          other.key.step += 1;
          const double moved = worst(run_core(model::AttentionKind::tiled, q, k, v, dout, B, other), naive);
          control_line = ", control (other step's masks) " + std::to_string(moved);
          CHECK(moved > 100 * kTol);
        }
        MESSAGE("T " << T << " heads " << H << " dropout " << p << ": max |tiled - naive| over out, dq, dk, dv "
                     << diff << " (tol " << kTol << ")" << control_line);
        CHECK(diff <= kTol);
      }
    }
  }
}

TEST_CASE("tiled attention: TP-local heads draw the global heads' masks") {
  auto gen = at::detail::createCPUGenerator(7);
  const int64_t B = 2, H = 2, T = 100, D = 8;
  at::Tensor q = at::randn({B * H, T, D}, gen), k = at::randn({B * H, T, D}, gen), v = at::randn({B * H, T, D}, gen),
             dout = at::randn({B * H, T, D}, gen);
  const model::AttentionDropout drop = dropout_of(0.1, B, H, /*heads_global=*/8, /*head_begin=*/4);
  const double diff = worst(run_core(model::AttentionKind::tiled, q, k, v, dout, B, drop),
                            run_core(model::AttentionKind::naive, q, k, v, dout, B, drop));
  MESSAGE("heads 4..5 of 8: max |tiled - naive| " << diff << " (tol " << kTol << ")");
  CHECK(diff <= kTol);
}

namespace {

// naive_attention on the head-major copy of qkv [B, T, 3C] (what gpt.cpp
// does off the strided path): y [B, T, C] and d(qkv) for dy.
std::pair<at::Tensor, at::Tensor> head_major_core(const at::Tensor& qkv0, const at::Tensor& dy, int64_t H) {
  const int64_t B = qkv0.size(0), T = qkv0.size(1), C = qkv0.size(2) / 3, D = C / H;
  at::Tensor qkv = qkv0.clone().requires_grad_(true);
  auto parts = qkv.view({B, T, 3, H, D}).permute({2, 0, 3, 1, 4}).contiguous().view({3, B * H, T, D}).unbind(0);
  at::Tensor bias;
  at::Tensor y = model::naive_attention(parts[0], parts[1], parts[2], B, model::AttentionDropout{}, &bias);
  y = y.view({B, H, T, D}).transpose(1, 2).reshape({B, T, C});
  return {y.detach(), torch::autograd::grad({y}, {qkv}, {dy})[0]};
}

std::pair<at::Tensor, at::Tensor> strided_core(const at::Tensor& qkv0, const at::Tensor& dy, int64_t H) {
  at::Tensor qkv = qkv0.clone().requires_grad_(true);
  at::Tensor bias;
  at::Tensor y = model::strided_attention(qkv, H, &bias);
  return {y.detach(), torch::autograd::grad({y}, {qkv}, {dy})[0]};
}

}  // namespace

TEST_CASE("strided attention: the naive core's output and gradients without the head-major copies") {
  auto gen = at::detail::createCPUGenerator(11);
  struct Shape {
    int64_t B, H, T, D;
  };
  for (const Shape s : {Shape{1, 1, 1, 4}, Shape{3, 4, 17, 8}, Shape{2, 3, 64, 16}, Shape{4, 8, 128, 64},
                        Shape{2, 2, 192, 16}}) {
    const int64_t C = s.H * s.D;
    const at::Tensor qkv = at::randn({s.B, s.T, 3 * C}, gen), dy = at::randn({s.B, s.T, C}, gen);
    REQUIRE(model::strided_attention_applies(qkv));
    const auto ref = head_major_core(qkv, dy, s.H);
    const auto got = strided_core(qkv, dy, s.H);
    const double diff = std::max(max_abs_diff(got.first, ref.first), max_abs_diff(got.second, ref.second));
    // Control: the same call with the heads split wrongly (2H heads of D/2).
    const auto wrong = strided_core(qkv, dy, 2 * s.H);
    const double control = std::max(max_abs_diff(wrong.first, ref.first), max_abs_diff(wrong.second, ref.second));
    MESSAGE("B " << s.B << ", H " << s.H << ", T " << s.T << ", D " << s.D << ": max |strided - head-major| of y and d(qkv) "
                 << diff << " (tol 1e-6); control (2H heads) " << control);
    CHECK(diff <= 1e-6);
    if (s.T > 1) CHECK(control > 1e-4);
  }
  // Off the CPU's fp32 (here: fp64) it does not apply; gpt.cpp keeps the copy.
  CHECK_FALSE(model::strided_attention_applies(at::zeros({1, 2, 6}, at::kDouble)));
}

namespace {

struct ModelGrads {
  double loss = 0;
  std::vector<at::Tensor> grads;
};

ModelGrads train_once(dtrain::Recompute recompute, const std::string& attention, bool redraw = false,
                      double dropout = 0.1) {
  model::GptConfig cfg;
  cfg.vocab = 64;
  cfg.layers = 2;
  cfg.d_model = 32;
  cfg.heads = 4;
  cfg.seq_len = 24;
  cfg.dropout = dropout;
  cfg.attention = attention;
  model::Gpt gpt(cfg, 99);
  parallel::apply_activation_checkpointing(*gpt, recompute, redraw);
  gpt->set_dropout_position({1234, 3, 8, 0});
  auto gen = at::detail::createCPUGenerator(5);
  at::Tensor tokens = at::randint(0, 64, {4, 24}, gen, at::kLong), targets = at::randint(0, 64, {4, 24}, gen, at::kLong);
  at::Tensor loss = gpt->loss(tokens, targets);
  // Another micro-batch's forward between this forward and its backward (a
  // pipeline does this): the recomputation must use the forward's position.
  gpt->set_dropout_position({1234, 3, 8, 4});
  loss.backward();
  ModelGrads r{loss.item<double>(), {}};
  for (auto& p : gpt->parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

double grads_diff(const ModelGrads& a, const ModelGrads& b) {
  double d = std::abs(a.loss - b.loss);
  for (size_t i = 0; i < a.grads.size(); ++i) d = std::max(d, max_abs_diff(a.grads[i], b.grads[i]));
  return d;
}

}  // namespace

TEST_CASE("recompute full and selective: the same loss and gradients as none, dropout 0.1") {
  for (const std::string attention : {"naive", "tiled"}) {
    const ModelGrads none = train_once(dtrain::Recompute::none, attention);
    for (const dtrain::Recompute mode : {dtrain::Recompute::full, dtrain::Recompute::selective}) {
      const double diff = grads_diff(train_once(mode, attention), none);
      const double control = grads_diff(train_once(mode, attention, /*redraw=*/true), none);
      MESSAGE("attention " << attention << ", recompute " << to_string(mode) << ": max |diff| of loss and gradients " << diff
                           << " (tol 1e-6); control (recompute redraws masks) " << control);
      CHECK(diff <= 1e-6);
      CHECK(control > 1e-4);
    }
  }
  const double tiled_vs_naive = grads_diff(train_once(dtrain::Recompute::none, "tiled"),
                                           train_once(dtrain::Recompute::none, "naive"));
  MESSAGE("attention tiled vs naive, GPT gradients: " << tiled_vs_naive << " (tol " << kTol << ")");
  CHECK(tiled_vs_naive <= kTol);
}

TEST_CASE("strided attention in a GPT: the same loss and gradients as the head-major core, dropout 0") {
  // Without recompute a GPT's naive core takes the strided path; selective
  // recompute runs the core through its runner on head-major q, k, v.
  const ModelGrads strided = train_once(dtrain::Recompute::none, "naive", false, /*dropout=*/0.0);
  const ModelGrads head_major = train_once(dtrain::Recompute::selective, "naive", false, /*dropout=*/0.0);
  const ModelGrads control = train_once(dtrain::Recompute::none, "naive", false, /*dropout=*/0.1);
  const double diff = grads_diff(strided, head_major);
  MESSAGE("GPT loss and gradients, strided vs head-major core: max |diff| " << diff
                                                                           << " (tol 1e-6); control (dropout 0.1) "
                                                                           << grads_diff(control, head_major));
  CHECK(diff <= 1e-6);
  CHECK(grads_diff(control, head_major) > 1e-4);
}
