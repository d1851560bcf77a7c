// Unit tests of engine/model/fused_ops.h: each fused CPU kernel (residual
// add + LayerNorm / RMSNorm, SwiGLU, GELU, a linear's bias + GELU, the
// causal softmax) against the ATen composition it
// replaces, forward and every gradient, at 1e-6 of each tensor's largest
// magnitude (max |diff| / max(1, max |ref|): fp32 holds values near 8 to
// only ~1e-6 absolute), printed beside the tolerance, each with a negative
// control (a composition that differs slightly: it must miss by >= 100x); and a GPT and a Llama against their
// own modules run through ATen's ops, loss and every parameter's gradient;
// and the GELU and causal softmax kernels' vector widths against each
// other, bit for bit.
// Legend: N = rows, C = channels, F = SwiGLU hidden width.
#include "engine/model/fused_ops.h"

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model/fused_kernels.h"
#include "engine/model/gpt.h"
#include "engine/model/llama.h"
#include "tests/support/skip.h"

namespace model = dtrain::engine::model;

namespace {

constexpr double kTol = 1e-6;

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// max |a - b| relative to the reference's scale: / max(1, max |b|).
double scaled_diff(const at::Tensor& a, const at::Tensor& b) {
  return max_abs_diff(a, b) / std::max(1.0, b.abs().max().item<double>());
}

// Leaves with grad, from one seeded generator.
at::Tensor leaf(std::vector<int64_t> sizes, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  auto gen = at::detail::createCPUGenerator(seed);
  return (at::randn(sizes, gen) * scale + shift).requires_grad_(true);
}

std::vector<at::Tensor> grads_of(const at::Tensor& loss, const std::vector<at::Tensor>& wrt) {
  std::vector<at::Tensor> g;
  for (auto& t : wrt) t.mutable_grad() = at::Tensor();
  loss.backward();
  for (const auto& t : wrt) g.push_back(t.grad().clone());
  return g;
}

// The ATen composition of a norm, as the model ran it before the kernels.
at::Tensor composed_norm(const at::Tensor& h, const model::NormParams& p) {
  if (!p.rms) return at::layer_norm(h, {h.size(-1)}, p.weight, p.bias, p.eps);
  return p.weight * (h * at::rsqrt(h.pow(2).mean(-1, true) + p.eps));
}

// x + r and its norm through the fused kernel and the composition; the
// loss reads both outputs (h also feeds the next residual add), so dx
// carries h's two gradients. Returns the max diff over outputs and grads;
// `eps_ref` differs from p.eps for the negative control.
double add_norm_diff(bool rms, bool residual, double eps_ref) {
  const int64_t N = 24, C = 96;
  at::Tensor x = leaf({2, N / 2, C}, 1, 1.5, 0.3), r = leaf({2, N / 2, C}, 2);
  at::Tensor w = leaf({C}, 3, 0.2, 1.0), b = leaf({C}, 4, 0.1);
  at::Tensor gy = at::randn({2, N / 2, C}, at::detail::createCPUGenerator(5));
  at::Tensor gh = at::randn({2, N / 2, C}, at::detail::createCPUGenerator(6));
  model::NormParams p{w, rms ? at::Tensor() : b, 1e-5, rms};
  std::vector<at::Tensor> wrt = {x, r, w};
  if (!rms) wrt.push_back(b);
  if (!residual) wrt = {x, w}, wrt.push_back(b);
  if (!residual && rms) wrt.pop_back();

  at::Tensor y_f, h_f;
  if (residual) std::tie(h_f, y_f) = model::fused_add_norm(x, r, p);
  else y_f = model::fused_norm(x, p), h_f = x;
  const at::Tensor loss_f = (y_f * gy).sum() + (residual ? (h_f * gh).sum() : at::zeros({}));
  std::vector<at::Tensor> g_f = grads_of(loss_f, wrt);

  model::NormParams pr = p;
  pr.eps = eps_ref;
  at::Tensor h_c = residual ? x + r : x;
  at::Tensor y_c = composed_norm(h_c, pr);
  const at::Tensor loss_c = (y_c * gy).sum() + (residual ? (h_c * gh).sum() : at::zeros({}));
  std::vector<at::Tensor> g_c = grads_of(loss_c, wrt);

  double d = std::max(scaled_diff(y_f, y_c), scaled_diff(h_f, h_c));
  for (size_t i = 0; i < g_f.size(); ++i) d = std::max(d, scaled_diff(g_f[i], g_c[i]));
  return d;
}

double swiglu_diff(bool control) {
  const int64_t F = 80;
  at::Tensor gu = leaf({3, 7, 2 * F}, 7, 2.0);
  at::Tensor gy = at::randn({3, 7, F}, at::detail::createCPUGenerator(8));
  const at::Tensor y_f = model::fused_swiglu(gu);
  const std::vector<at::Tensor> g_f = grads_of((y_f * gy).sum(), {gu});
  // The negative control: sigmoid (not silu) of the gate.
  const at::Tensor y_c = control ? at::sigmoid(gu.narrow(-1, 0, F)) * gu.narrow(-1, F, F) : model::swiglu(gu);
  const std::vector<at::Tensor> g_c = grads_of((y_c * gy).sum(), {gu});
  return std::max(scaled_diff(y_f, y_c), scaled_diff(g_f[0], g_c[0]));
}

// GELU forward and backward against at::gelu (exact) over values from -12
// to 12 (both tails: erf's saturation, exp's underflow) plus randn, sizes
// that leave a scalar remainder after the 8-wide loop. The negative
// control: at::gelu's tanh approximation as the reference.
double gelu_diff(bool control) {
  double d = 0;
  for (int64_t n : {1, 7, 8, 1001, 4096}) {
    at::Tensor x = n >= 1001 ? at::cat({at::linspace(-12, 12, n - 1000), at::randn({1000}, at::detail::createCPUGenerator(9)) * 3})
                             : at::randn({n}, at::detail::createCPUGenerator(9)) * 3;
    x = x.reshape({1, -1}).requires_grad_(true);
    at::Tensor gy = at::randn(x.sizes(), at::detail::createCPUGenerator(10));
    const at::Tensor y_f = model::fused_gelu(x);
    const std::vector<at::Tensor> g_f = grads_of((y_f * gy).sum(), {x});
    const at::Tensor y_c = control ? at::gelu(x, "tanh") : at::gelu(x);
    const std::vector<at::Tensor> g_c = grads_of((y_c * gy).sum(), {x});
    d = std::max({d, scaled_diff(y_f, y_c), scaled_diff(g_f[0], g_c[0])});
  }
  return d;
}

}  // namespace

TEST_CASE("fused GELU (forward and backward) matches at::gelu at 1e-6") {
  const double d = gelu_diff(false), control = gelu_diff(true);
  MESSAGE("GELU: max scaled |diff| " << d << " (tolerance " << kTol << "); control (tanh approximation) " << control);
  CHECK(d <= kTol);
  CHECK(control >= 100 * kTol);
}

namespace {

// gelu(x W^T + b) as one node (the GEMM without its bias, then bias + GELU
// in one pass; backward GELU's and the bias's gradients in one) against
// at::gelu(at::linear(x, w, b)), forward and the gradients of x, w and b,
// x 3-D and 2-D; F = 45 leaves remainders after the 16- and 8-wide loops.
// The negative control: the tanh approximation in the reference.
double linear_gelu_diff(bool control) {
  double d = 0;
  for (bool three_d : {true, false}) {
    const int64_t K = 24, F = 45;
    at::Tensor x = three_d ? leaf({3, 7, K}, 21) : leaf({19, K}, 21);
    at::Tensor w = leaf({F, K}, 22, 0.3), b = leaf({F}, 23, 1.0, 0.5);
    std::vector<int64_t> out = x.sizes().vec();
    out.back() = F;
    const at::Tensor gy = at::randn(out, at::detail::createCPUGenerator(24));
    const at::Tensor y_f = model::fused_linear_gelu(x, w, b);
    const std::vector<at::Tensor> g_f = grads_of((y_f * gy).sum(), {x, w, b});
    const at::Tensor y_c = control ? at::gelu(at::linear(x, w, b), "tanh") : at::gelu(at::linear(x, w, b));
    const std::vector<at::Tensor> g_c = grads_of((y_c * gy).sum(), {x, w, b});
    d = std::max({d, scaled_diff(y_f, y_c), scaled_diff(g_f[0], g_c[0]), scaled_diff(g_f[1], g_c[1]),
                  scaled_diff(g_f[2], g_c[2])});
  }
  return d;
}

// The GELU kernels at a width the CPU has against the AVX2 loop, bit for
// bit: flat forward and backward, and the bias variants over rows whose
// width leaves every remainder; inputs from -20 to 20 (the flushed tails
// included). Returns the number of elements that differ (the bias
// gradient's doubles included).
int64_t gelu_width_mismatches(model::kernels::VecIsa isa) {
  using model::kernels::VecIsa;
  int64_t bad = 0;
  auto differ = [](const std::vector<float>& a, const std::vector<float>& b) {
    int64_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return n;
  };
  for (int64_t F : {1, 7, 8, 15, 16, 23, 45, 2048}) {
    const int64_t N = 5, n = N * F;
    const at::Tensor xt =
        at::cat({at::linspace(-20, 20, n / 2), at::randn({n - n / 2}, at::detail::createCPUGenerator(31)) * 3});
    const at::Tensor dyt = at::randn({n}, at::detail::createCPUGenerator(32));
    const at::Tensor bt = at::randn({F}, at::detail::createCPUGenerator(33));
    const float *x = xt.const_data_ptr<float>(), *dy = dyt.const_data_ptr<float>(), *b = bt.const_data_ptr<float>();
    std::vector<std::vector<float>> y(2, std::vector<float>(size_t(n))), dx = y, h = y, y2 = y, dpre = y;
    std::vector<std::vector<double>> db(2, std::vector<double>(size_t(F), 0.0));
    for (int k = 0; k < 2; ++k) {
      const VecIsa at_isa = k == 0 ? VecIsa::avx2 : isa;
      model::kernels::gelu_forward(x, y[k].data(), n, at_isa);
      model::kernels::gelu_backward(dy, x, dx[k].data(), n, at_isa);
      h[k].assign(x, x + n);
      model::kernels::bias_gelu_forward(h[k].data(), b, y2[k].data(), N, F, at_isa);
      model::kernels::gelu_backward_bias(dy, h[k].data(), dpre[k].data(), db[k].data(), N, F, at_isa);
    }
    bad += differ(y[0], y[1]) + differ(dx[0], dx[1]) + differ(h[0], h[1]) + differ(y2[0], y2[1]) +
           differ(dpre[0], dpre[1]);
    for (int64_t j = 0; j < F; ++j) bad += std::memcmp(&db[0][size_t(j)], &db[1][size_t(j)], sizeof(double)) != 0;
  }
  return bad;
}

// Subnormal floats in t (the GEMMs that read them run several times slower).
int64_t subnormals(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  int64_t n = 0;
  for (const float *p = c.const_data_ptr<float>(), *e = p + c.numel(); p < e; ++p)
    n += std::fpclassify(*p) == FP_SUBNORMAL;
  return n;
}

}  // namespace

TEST_CASE("the GELU kernels give no subnormals in the far tail (x < -13), forward or backward at dy 1") {
  using model::kernels::VecIsa;
  // -200 .. 200 in steps of 0.005, the tail -13.2 .. -12.5 included
  const at::Tensor x = at::linspace(-200, 200, 80001);
  const at::Tensor ones = at::ones_like(x);
  int64_t bad = 0;
  for (VecIsa isa : {VecIsa::scalar, VecIsa::avx2, VecIsa::avx512}) {
    if (!model::kernels::isa_available(isa)) continue;
    at::Tensor y = at::empty_like(x), dx = at::empty_like(x);
    model::kernels::gelu_forward(x.const_data_ptr<float>(), y.mutable_data_ptr<float>(), x.numel(), isa);
    model::kernels::gelu_backward(ones.const_data_ptr<float>(), x.const_data_ptr<float>(), dx.mutable_data_ptr<float>(),
                                  x.numel(), isa);
    bad += subnormals(y) + subnormals(dx);
  }
  // The negative control: the exact GELU in fp32 through erfc, whose tail is subnormal.
  const int64_t control = subnormals(x * 0.5 * at::erfc(-x * 0.70710678118654752));
  MESSAGE("GELU kernels: " << bad << " subnormal outputs; control (x * erfc(-x / sqrt 2) / 2): " << control);
  CHECK(bad == 0);
  CHECK(control > 0);
}

TEST_CASE("fused linear + bias + GELU matches at::gelu(at::linear(x, w, b)) at 1e-6, gradients of x, w, b") {
  const double d = linear_gelu_diff(false), control = linear_gelu_diff(true);
  MESSAGE("linear + bias + GELU: max scaled |diff| " << d << " (tolerance " << kTol
                                                     << "); control (tanh approximation) " << control);
  CHECK(d <= kTol);
  CHECK(control >= 100 * kTol);
}

TEST_CASE("the GELU kernels give the same bits at AVX-512 as at AVX2") {
  using model::kernels::VecIsa;
  if (!model::kernels::isa_available(VecIsa::avx2))
    DTRAIN_SKIP(cpu, "this CPU has no AVX2 + FMA: only the scalar GELU runs here");
  // The negative control: the scalar loop (std::exp, not the vector exp) differs from the AVX2 one.
  const int64_t control = gelu_width_mismatches(VecIsa::scalar);
  MESSAGE("scalar vs AVX2 (control): " << control << " elements differ");
  CHECK(control > 100);
  if (!model::kernels::isa_available(VecIsa::avx512))
    DTRAIN_SKIP(cpu, "this CPU has no AVX-512 (F + DQ): the AVX-512 GELU loop cannot run here (the control ran)");
  const int64_t bad = gelu_width_mismatches(VecIsa::avx512);
  MESSAGE("AVX-512 vs AVX2: " << bad << " elements differ (of every output, bias gradients included)");
  CHECK(bad == 0);
}

namespace {

// The causal softmax kernels on scores [R, T] (R = rows of [B*H, T, T]) at
// `isa`, forward p and backward ds for upstream dp; entries above each
// row's diagonal are set to NaN first: the kernels must not read them.
std::pair<at::Tensor, at::Tensor> causal_softmax_kernels(const at::Tensor& s0, const at::Tensor& dp0, double scale,
                                                         model::kernels::VecIsa isa) {
  const int64_t R = s0.size(0), T = s0.size(1);
  const at::Tensor above = at::ones({T, T}, at::kBool).triu(1).repeat({R / T, 1});  // [R, T]
  at::Tensor s = s0.masked_fill(above, NAN), dp = dp0.masked_fill(above, NAN);
  at::Tensor p = at::empty_like(s), ds = at::empty_like(s);
  model::kernels::causal_softmax_forward(s.const_data_ptr<float>(), p.mutable_data_ptr<float>(), R, T, float(scale),
                                         isa);
  model::kernels::causal_softmax_backward(dp.const_data_ptr<float>(), p.const_data_ptr<float>(),
                                          ds.mutable_data_ptr<float>(), R, T, isa);
  return {p, ds};
}

// ATen's composition the strided attention ran before: softmax(scale s +
// causal -inf bias) and _softmax_backward_data; `causal` false drops the
// mask (the negative control).
std::pair<at::Tensor, at::Tensor> causal_softmax_aten(const at::Tensor& s, const at::Tensor& dp, double scale,
                                                      bool causal = true) {
  const int64_t R = s.size(0), T = s.size(1);
  at::Tensor bias = at::full({T, T}, causal ? -INFINITY : 0.0f).triu(1).repeat({R / T, 1});
  at::Tensor p = at::softmax(s * scale + bias, -1);
  return {p, at::_softmax_backward_data(dp, p, -1, at::kFloat)};
}

const std::vector<int64_t> kSoftmaxT = {1, 5, 15, 16, 17, 33, 128, 131};

}  // namespace

TEST_CASE("the causal softmax kernel matches ATen's softmax with the -inf bias at 1e-6, forward and backward") {
  double worst = 0, control = INFINITY;
  for (const int64_t T : kSoftmaxT) {
    auto gen = at::detail::createCPUGenerator(uint64_t(T));
    const double scale = 1.0 / std::sqrt(64.0);
    const at::Tensor s = at::randn({3 * T, T}, gen) * 8, dp = at::randn({3 * T, T}, gen);
    const auto ref = causal_softmax_aten(s, dp, scale);
    const auto got = causal_softmax_kernels(s, dp, scale, model::kernels::best_isa());
    worst = std::max({worst, scaled_diff(got.first, ref.first), scaled_diff(got.second, ref.second)});
    if (T > 1) {
      const auto no_mask = causal_softmax_aten(s, dp, scale, false);
      control = std::min(control, std::max(scaled_diff(no_mask.first, ref.first), scaled_diff(no_mask.second, ref.second)));
    }
    // Above the diagonal: exactly 0, the NaN there never read.
    const at::Tensor above = at::ones({T, T}, at::kBool).triu(1).repeat({3, 1});
    CHECK(got.first.masked_select(above).abs().sum().item<double>() == 0);
    CHECK(got.second.masked_select(above).abs().sum().item<double>() == 0);
  }
  MESSAGE("causal softmax: max scaled |diff| " << worst << " over T in 1..131 (tolerance " << kTol
                                               << "); control (no mask) " << control);
  CHECK(worst <= kTol);
  CHECK(control >= 100 * kTol);
}

TEST_CASE("the causal softmax kernel gives the same bits at every width, and NaN rows stay NaN") {
  using model::kernels::VecIsa;
  int64_t differ = 0, control = 0;
  for (const int64_t T : kSoftmaxT) {
    auto gen = at::detail::createCPUGenerator(uint64_t(100 + T));
    const at::Tensor s = at::randn({2 * T, T}, gen) * 8, dp = at::randn({2 * T, T}, gen);
    const auto scalar = causal_softmax_kernels(s, dp, 0.125, VecIsa::scalar);
    for (VecIsa isa : {VecIsa::avx2, VecIsa::avx512}) {
      if (!model::kernels::isa_available(isa)) continue;
      const auto got = causal_softmax_kernels(s, dp, 0.125, isa);
      differ += at::ne(got.first, scalar.first).sum().item<int64_t>() + at::ne(got.second, scalar.second).sum().item<int64_t>();
    }
    // The negative control: ATen's softmax differs from the kernel in some last bits.
    control += at::ne(causal_softmax_aten(s, dp, 0.125).first, scalar.first).sum().item<int64_t>();
  }
  MESSAGE("causal softmax: " << differ << " elements differ between the scalar and the vector widths ("
                             << std::string(model::kernels::isa_available(VecIsa::avx512) ? "AVX2 and AVX-512"
                                 : model::kernels::isa_available(VecIsa::avx2) ? "AVX2 only: no AVX-512 here"
                                                                               : "none: scalar only here")
                             << "); control (ATen's softmax): " << control);
  CHECK(differ == 0);
  CHECK(control > 100);
  // A NaN score makes its row NaN (as ATen's softmax), the other rows untouched.
  const int64_t T = 40;
  at::Tensor s = at::randn({T, T}), dp = at::randn({T, T});
  s.index_put_({20, 3}, NAN);
  const auto got = causal_softmax_kernels(s, dp, 0.125, model::kernels::best_isa());
  CHECK(at::isnan(got.first[20].narrow(0, 0, 21)).all().item<bool>());
  CHECK(at::isfinite(got.first.narrow(0, 0, 20)).all().item<bool>());
  CHECK(at::isfinite(got.first.narrow(0, 21, T - 21)).all().item<bool>());
}

TEST_CASE("fused residual add + LayerNorm, RMSNorm and residual add + RMSNorm match ATen at 1e-6") {
  for (bool rms : {false, true})
    for (bool residual : {false, true}) {
      if (!rms && !residual) continue;  // a lone LayerNorm is ATen's own (fused_norm)
      const double d = add_norm_diff(rms, residual, 1e-5);
      const double control = add_norm_diff(rms, residual, 1e-2);  // eps 1e-2 in the reference
      const std::string name = std::string(rms ? "RMSNorm" : "LayerNorm") + (residual ? " + residual add" : "");
      MESSAGE(name << ": max scaled |diff| " << d << " (tolerance " << kTol << "); control (eps 1e-2) " << control);
      CHECK(d <= kTol);
      CHECK(control >= 100 * kTol);
    }
}

TEST_CASE("fused SwiGLU (its backward) matches silu(gate) * up at 1e-6") {
  const double d = swiglu_diff(false), control = swiglu_diff(true);
  MESSAGE("SwiGLU: max scaled |diff| " << d << " (tolerance " << kTol << "); control (sigmoid for silu) " << control);
  CHECK(d <= kTol);
  CHECK(control >= 100 * kTol);
}

TEST_CASE("fused kernels fall back to ATen outside fp32") {
  // fp64 RMSNorm: the composition (fp32 inside, as RmsNormImpl), not the fp32 kernel (which would throw
  // on a double tensor's data).
  at::Tensor x = at::randn({4, 16}).to(at::kDouble), w = at::ones({16}, at::kDouble);
  const at::Tensor y = model::fused_norm(x, {w, at::Tensor(), 1e-5, true});
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor ref = w * (x32 * at::rsqrt(x32.pow(2).mean(-1, true) + 1e-5)).to(at::kDouble);
  CHECK((y.scalar_type() == at::kDouble));
  CHECK(max_abs_diff(y, ref) == 0.0);
}

// The model's forward (fused norms and SwiGLU) against the same modules
// run through ATen's ops by hand: the wiring (which norm, its eps, the
// residual read by ln2) as well as the kernels. The negative control feeds
// ln2 the block's input instead of x + attn(ln1(x)).
namespace {

at::Tensor composed_loss(model::GptImpl& m, const at::Tensor& tokens, const at::Tensor& targets, bool control) {
  at::Tensor h = m.embed(tokens);  // [B, T, C]
  for (const auto& mod : *m.blocks) {
    model::BlockImpl& b = *mod->as<model::Block>();
    const at::Tensor a = b.attn->forward(b.rms1 ? b.rms1->forward(h) : b.ln1->forward(h));
    const at::Tensor h2 = h + a, in2 = control ? h : h2;
    const at::Tensor n2 = b.rms2 ? b.rms2->forward(in2) : b.ln2->forward(in2);
    const at::Tensor f = b.mlp->gate_up ? at::linear(model::swiglu(at::linear(n2, b.mlp->gate_up->weight)),
                                                     b.mlp->proj->weight)
                                        : at::linear(at::gelu(at::linear(n2, b.mlp->fc->weight, b.mlp->fc->bias)),
                                                     b.mlp->proj->weight, b.mlp->proj->bias);  // GPT: ATen's GELU
    h = h2 + f;
  }
  const at::Tensor logits = m.head->forward(m.rms_f ? m.rms_f->forward(h) : m.ln_f->forward(h));  // [B, T, V]
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace

TEST_CASE("a GPT and a Llama (fused norms, GELU, SwiGLU) match their modules run through ATen's ops") {
  for (const char* kind : {"gpt", "llama"}) {
    model::GptConfig c;
    c.kind = kind;
    c.vocab = 64, c.layers = 2, c.d_model = 32, c.heads = 4, c.seq_len = 16;
    if (c.llama()) c.kv_heads = 2, c.ffn_hidden = 48;
    auto gen = at::detail::createCPUGenerator(11);
    const at::Tensor tokens = at::randint(c.vocab, {2, 16}, gen), targets = at::randint(c.vocab, {2, 16}, gen);
    model::Gpt m(c, 7);
    const std::vector<at::Tensor> params = m->parameters();
    std::vector<double> losses;
    std::vector<std::vector<at::Tensor>> grads;
    for (int run = 0; run < 3; ++run) {  // the model, the composition, the control
      const at::Tensor loss = run == 0 ? m->loss(tokens, targets) : composed_loss(*m, tokens, targets, run == 2);
      grads.push_back(grads_of(loss, params));
      losses.push_back(loss.item<double>());
    }
    double d = std::abs(losses[0] - losses[1]), control = std::abs(losses[0] - losses[2]);
    for (size_t i = 0; i < params.size(); ++i) {
      d = std::max(d, max_abs_diff(grads[0][i], grads[1][i]));
      control = std::max(control, max_abs_diff(grads[0][i], grads[2][i]));
    }
    MESSAGE(std::string(kind) << ": max |diff| over the loss and every gradient " << d << " (tolerance " << kTol
                 << "); control (ln2 reads the block's input) " << control);
    CHECK(d <= kTol);
    CHECK(control >= 100 * kTol);
  }
}
