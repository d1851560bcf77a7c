// Unit tests of engine/model (the GPT): shapes, stable parameter names,
// seeded deterministic init, loss of a fresh model ~ ln(vocab), causality,
// and that a few AdamW steps on one batch drive the loss down.
// Legend: B = batch, T = time, V = vocabulary.
#include "engine/model/gpt.h"
#include "engine/optim/adamw.h"

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using dtrain::engine::model::Gpt;
using dtrain::engine::model::GptConfig;

namespace {

GptConfig tiny_config() {
  GptConfig cfg;
  cfg.vocab = 256;
  cfg.layers = 2;
  cfg.d_model = 32;
  cfg.heads = 4;
  cfg.seq_len = 16;
  return cfg;
}

at::Tensor random_tokens(int64_t B, int64_t T, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randint(0, 256, {B, T}, gen, at::kLong);  // [B, T]
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item().toDouble(); }

}  // namespace

TEST_CASE("gpt: output shapes and parameter count") {
  Gpt gpt(tiny_config(), 1);
  auto logits = gpt->forward(random_tokens(3, 16, 5));
  CHECK(logits.sizes() == at::IntArrayRef({3, 16, 256}));  // [B, T, V]
  auto shorter = gpt->forward(random_tokens(2, 7, 5));
  CHECK(shorter.sizes() == at::IntArrayRef({2, 7, 256}));
  // wte + wpe + 2 blocks (4C^2+... ) + ln_f + head, computed by hand for C=32.
  const int64_t C = 32, V = 256, T = 16;
  const int64_t block = 2 * 2 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C);
  CHECK(gpt->num_params() == V * C + T * C + 2 * block + 2 * C + V * C);
  CHECK_THROWS(gpt->forward(random_tokens(1, 17, 5)));  // longer than seq_len
}

TEST_CASE("gpt: stable parameter names in registration order") {
  Gpt gpt(tiny_config(), 1);
  std::vector<std::string> names;
  for (const auto& item : gpt->named_parameters()) names.push_back(item.key());
  std::vector<std::string> expected = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    for (const char* n : {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                          "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias",
                          "mlp.proj.weight", "mlp.proj.bias"}) {
      expected.push_back(b + n);
    }
  }
  for (const char* n : {"ln_f.weight", "ln_f.bias", "head.weight"}) expected.push_back(n);
  CHECK(names == expected);
}

TEST_CASE("gpt: init is a function of the seed only") {
  Gpt a(tiny_config(), 42);
  at::manual_seed(123);  // the global generator must not matter
  Gpt b(tiny_config(), 42);
  at::manual_seed(999);
  Gpt c(tiny_config(), 43);
  auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  double max_same = 0.0;
  bool any_differs = false;
  for (const auto& item : pa) {
    max_same = std::max(max_same, max_abs_diff(item.value(), pb[item.key()]));
    if (item.value().numel() > 0 && !at::equal(item.value(), pc[item.key()])) any_differs = true;
  }
  std::printf("gpt init: max |seed42 - seed42| = %g (want 0)\n", max_same);
  CHECK(max_same == 0.0);
  CHECK(any_differs);
  // GPT-2 style values: biases zero, LayerNorm ones, weights ~ N(0, 0.02),
  // residual projections ~ N(0, 0.02 / sqrt(2 * layers)).
  CHECK(at::equal(pa["blocks.0.attn.qkv.bias"], at::zeros({96})));
  CHECK(at::equal(pa["blocks.1.ln2.weight"], at::ones({32})));
  const double std_qkv = pa["blocks.0.attn.qkv.weight"].std().item().toDouble();
  const double std_proj = pa["blocks.0.mlp.proj.weight"].std().item().toDouble();
  CHECK(std_qkv == doctest::Approx(0.02).epsilon(0.1));
  CHECK(std_proj == doctest::Approx(0.02 / std::sqrt(4.0)).epsilon(0.1));
}

TEST_CASE("gpt: a fresh model's loss is about ln(vocab)") {
  Gpt gpt(tiny_config(), 3);
  auto x = random_tokens(4, 16, 8), y = random_tokens(4, 16, 9);
  const double loss = gpt->loss(x, y).item().toDouble();
  std::printf("gpt fresh loss = %.4f, ln(256) = %.4f (tolerance 0.1)\n", loss, std::log(256.0));
  CHECK(std::abs(loss - std::log(256.0)) < 0.1);
}

TEST_CASE("gpt: causal, changing token t leaves logits before t unchanged") {
  Gpt gpt(tiny_config(), 4);
  auto x = random_tokens(2, 16, 10);
  auto x2 = x.clone();
  const int64_t t = 9;
  x2.select(1, t).fill_(7);
  x2.select(1, t).add_(x.select(1, t)).remainder_(256);  // surely different from x at t
  auto a = gpt->forward(x), b = gpt->forward(x2);
  const double before = max_abs_diff(a.narrow(1, 0, t), b.narrow(1, 0, t));
  const double at_t = max_abs_diff(a.narrow(1, t, 16 - t), b.narrow(1, t, 16 - t));
  std::printf("gpt causality: max diff before t = %g (want 0), from t on = %g (want > 0)\n", before, at_t);
  CHECK(before == 0.0);
  CHECK(at_t > 1e-6);
}

TEST_CASE("gpt: AdamW steps on one batch drive the loss down") {
  Gpt gpt(tiny_config(), 5);
  // A learnable batch: each row is a repeated random pattern of 4 tokens.
  auto pattern = random_tokens(4, 4, 11);
  auto seq = pattern.repeat({1, 5});  // [B, 20]
  auto x = seq.narrow(1, 0, 16), y = seq.narrow(1, 1, 16);
  std::vector<at::Tensor> params;
  std::vector<bool> decay;
  for (const auto& p : gpt->parameters()) {
    params.push_back(p);
    decay.push_back(p.dim() >= 2);
  }
  dtrain::engine::optim::AdamW opt(params, decay, {});
  const double first = gpt->loss(x, y).item().toDouble();
  double last = first;
  for (int i = 0; i < 30; ++i) {
    opt.zero_grad();
    auto loss = gpt->loss(x, y);
    loss.backward();
    opt.step(3e-3);
    last = loss.item().toDouble();
  }
  std::printf("gpt learns: loss %.4f -> %.4f after 30 steps (want < half)\n", first, last);
  CHECK(last < 0.5 * first);
}
