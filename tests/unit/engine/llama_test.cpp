// Unit tests of the Llama variant of engine/model (model.kind llama): the
// parameter names and shapes of the contract with Hugging Face import /
// export, the forward against a straightforward fp64 ATen composition
// (RMSNorm, rotate_half rotary, grouped-query attention by repeating k and
// v, SwiGLU), Llama 3.1's rotary scaling against its formula, and the
// grouped naive / tiled cores against plain attention on repeated k, v.
// Legend: B = batch, T = time, C = channels, H = heads, KV = kv heads, D = head dim.
#include "engine/model/gpt.h"

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace model = dtrain::engine::model;

namespace {

model::GptConfig tiny_llama() {
  model::GptConfig c;
  c.kind = "llama";
  c.vocab = 64;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_hidden = 48;
  c.seq_len = 16;
  c.norm_eps = 1e-5;
  c.rope.theta = 500000;
  return c;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// The reference, in fp64, from the parameters by name: no code shared with
// the model beyond the parameters themselves.
at::Tensor reference_logits(const model::GptConfig& c, std::map<std::string, at::Tensor> p, const at::Tensor& tokens) {
  for (auto& [name, t] : p) t = t.detach().to(at::kDouble);
  const int64_t B = tokens.size(0), T = tokens.size(1), H = c.heads, KV = c.kv(), D = c.d_model / H;
  const auto rms = [&](const at::Tensor& x, const at::Tensor& w) {
    return x / at::sqrt(x.pow(2).mean(-1, true) + c.norm_eps) * w;
  };
  // Rotation of each pair (j, j + D/2) by angle pos / theta^(2j/D).
  at::Tensor j = at::arange(D / 2, at::kDouble);
  at::Tensor angle = at::arange(T, at::kDouble).unsqueeze(1) / at::pow(c.rope.theta, 2 * j / double(D));  // [T, D/2]
  const auto rope = [&](const at::Tensor& x) {  // [B, n, T, D]
    at::Tensor x1 = x.narrow(3, 0, D / 2), x2 = x.narrow(3, D / 2, D / 2);
    return at::cat({x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()}, 3);
  };
  at::Tensor h = p["wte.weight"].index_select(0, tokens.reshape({-1})).view({B, T, c.d_model});
  at::Tensor mask = at::ones({T, T}, at::kBool).triu(1);
  for (int i = 0; i < c.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    at::Tensor x = rms(h, p[b + "ln1.weight"]);
    at::Tensor q = at::matmul(x, p[b + "attn.q.weight"].t()).view({B, T, H, D}).transpose(1, 2);
    at::Tensor kv = at::matmul(x, p[b + "attn.kv.weight"].t());
    at::Tensor k = kv.narrow(2, 0, KV * D).view({B, T, KV, D}).transpose(1, 2);
    at::Tensor v = kv.narrow(2, KV * D, KV * D).view({B, T, KV, D}).transpose(1, 2);
    q = rope(q), k = rope(k);
    k = k.repeat_interleave(H / KV, 1), v = v.repeat_interleave(H / KV, 1);  // [B, H, T, D]
    at::Tensor s = at::matmul(q, k.transpose(2, 3)) / std::sqrt(double(D));
    at::Tensor y = at::matmul(at::softmax(s.masked_fill(mask, -INFINITY), -1), v);
    h = h + at::matmul(y.transpose(1, 2).reshape({B, T, H * D}), p[b + "attn.proj.weight"].t());
    x = rms(h, p[b + "ln2.weight"]);
    at::Tensor gu = at::matmul(x, p[b + "mlp.gate_up.weight"].t());
    const int64_t F = gu.size(2) / 2;
    at::Tensor g = gu.narrow(2, 0, F), u = gu.narrow(2, F, F);
    h = h + at::matmul(g * at::sigmoid(g) * u, p[b + "mlp.proj.weight"].t());
  }
  const at::Tensor head = p.count("head.weight") ? p["head.weight"] : p["wte.weight"];
  return at::matmul(rms(h, p["ln_f.weight"]), head.t());
}

std::map<std::string, at::Tensor> params_of(model::Gpt& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : m->named_parameters()) out[item.key()] = item.value();
  return out;
}

}  // namespace

TEST_CASE("llama: the parameter names and shapes of LLAMA_NAMES (dense, tied, MoE)") {
  model::GptConfig c = tiny_llama();
  model::Gpt m(c, 1);
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {{"wte.weight", {64, 32}}};
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    want.insert(want.end(), {{b + "ln1.weight", {32}}, {b + "attn.q.weight", {32, 32}},
                             {b + "attn.kv.weight", {2 * 2 * 8, 32}}, {b + "attn.proj.weight", {32, 32}},
                             {b + "ln2.weight", {32}}, {b + "mlp.gate_up.weight", {96, 32}},
                             {b + "mlp.proj.weight", {32, 48}}});
  }
  want.insert(want.end(), {{"ln_f.weight", {32}}, {"head.weight", {64, 32}}});
  std::vector<std::pair<std::string, std::vector<int64_t>>> got;
  for (const auto& item : m->named_parameters()) got.emplace_back(item.key(), item.value().sizes().vec());
  CHECK(got == want);
  c.tie_embeddings = true;
  c.moe.experts = 4, c.moe.top_k = 2, c.moe.d_ff = 24, c.moe.every = 2;
  model::Gpt moe(c, 1);
  const auto p = params_of(moe);
  CHECK(p.count("head.weight") == 0);
  CHECK(p.at("blocks.0.moe.router.weight").sizes().vec() == std::vector<int64_t>{4, 32});
  CHECK(p.at("blocks.0.moe.fc.weight").sizes().vec() == std::vector<int64_t>{4, 48, 32});
  CHECK(p.at("blocks.0.moe.proj.weight").sizes().vec() == std::vector<int64_t>{4, 32, 24});
  CHECK(p.count("blocks.0.moe.fc.bias") == 0);
  CHECK(p.count("blocks.1.mlp.gate_up.weight") == 1);
}

TEST_CASE("llama: logits match an fp64 ATen composition (RMSNorm, rotary, GQA, SwiGLU), untied and tied") {
  for (bool tied : {false, true}) {
    model::GptConfig c = tiny_llama();
    c.tie_embeddings = tied;
    model::Gpt m(c, 7);
    {  // norms away from 1, so a missing weight would show
      at::NoGradGuard no_grad;
      auto gen = at::detail::createCPUGenerator(3);
      for (auto& item : m->named_parameters())
        if (item.key().find("ln") != std::string::npos) item.value().uniform_(0.5, 1.5, gen);
    }
    auto gen = at::detail::createCPUGenerator(11);
    at::Tensor tokens = at::randint(0, 64, {3, 16}, gen, at::kLong);  // [B, T]
    const double diff = max_abs_diff(m->forward(tokens), reference_logits(c, params_of(m), tokens));
    MESSAGE("llama (tied " << tied << "): max |logits - fp64 reference| " << diff << " (tol 1e-6)");
    CHECK(diff <= 1e-6);
  }
}

TEST_CASE("llama: Llama 3.1 rotary scaling follows its formula; positions are global") {
  model::RotaryConfig r;
  r.theta = 500000, r.factor = 8, r.low_freq_factor = 1, r.high_freq_factor = 4, r.original_max_position = 64;
  const int64_t D = 32;
  const at::Tensor got = model::rotary_inv_freq(r, D);
  double worst = 0;
  int low = 0, mid = 0, high = 0;
  for (int64_t j = 0; j < D / 2; ++j) {
    const double f = 1.0 / std::pow(r.theta, 2.0 * j / D), wavelen = 2 * M_PI / f;
    double want = f;  // high frequencies kept
    if (wavelen > 64.0 / 1) want = f / 8, ++low;
    else if (wavelen >= 64.0 / 4) {
      const double s = (64.0 / wavelen - 1) / (4 - 1);
      want = (1 - s) * f / 8 + s * f, ++mid;
    } else {
      ++high;
    }
    worst = std::max(worst, std::fabs(got[j].item<double>() - want) / want);
  }
  MESSAGE("llama 3.1 inv_freq: max rel diff " << worst << " (tol 1e-6) over " << low << " scaled, " << mid
                                              << " interpolated, " << high << " kept frequencies");
  CHECK((low > 0 && mid > 0 && high > 0));
  CHECK(worst <= 1e-6);
  // cos/sin at positions 5..8 are rows 5..8 of those at 0..8.
  const auto all = model::rotary_cos_sin(r, D, at::arange(9, at::kLong));
  const auto tail = model::rotary_cos_sin(r, D, at::arange(5, 9, at::kLong));
  CHECK(max_abs_diff(all[0].narrow(0, 5, 4), tail[0]) == 0);
  CHECK(max_abs_diff(all[1].narrow(0, 5, 4), tail[1]) == 0);
}

TEST_CASE("llama: grouped-query cores (naive grouped, tiled) equal plain attention on repeated k, v, grads too") {
  const int64_t B = 2, H = 4, KV = 2, T = 70, D = 8;  // T > one tile
  auto gen = at::detail::createCPUGenerator(5);
  at::Tensor q = at::randn({B * H, T, D}, gen).requires_grad_(true);
  at::Tensor k = at::randn({B * KV, T, D}, gen).requires_grad_(true), v = at::randn({B * KV, T, D}, gen).requires_grad_(true);
  at::Tensor dout = at::randn({B * H, T, D}, gen);
  // The reference: k, v repeated per query head by an explicit gather.
  at::Tensor idx = (at::arange(B * H) / H) * KV + (at::arange(B * H) % H) / (H / KV);  // [B*H] kv row of each q row
  const auto grads = [&](model::AttentionKind kind, bool repeated) {
    for (auto* t : {&q, &k, &v}) t->mutable_grad() = at::Tensor();
    at::Tensor bias;
    at::Tensor kk = repeated ? k.index_select(0, idx) : k, vv = repeated ? v.index_select(0, idx) : v;
    at::Tensor out = model::attention_core(kind, q, kk, vv, B, {}, &bias);
    out.backward(dout);
    return std::vector<at::Tensor>{out.detach(), q.grad().clone(), k.grad().clone(), v.grad().clone()};
  };
  const auto ref = grads(model::AttentionKind::naive, true);
  for (auto kind : {model::AttentionKind::naive, model::AttentionKind::tiled}) {
    const auto got = grads(kind, false);
    double diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) diff = std::max(diff, max_abs_diff(got[i], ref[i]));
    MESSAGE((kind == model::AttentionKind::naive ? "naive" : "tiled")
            << " grouped (H 4, KV 2): max |out, dq, dk, dv - repeated| " << diff << " (tol 1e-5)");
    CHECK(diff <= 1e-5);
  }
}
