// Unit tests of engine/optim: AdamW against a scalar fp64 reference written
// from torch.optim.AdamW's documented update (max difference printed), the
// warmup + cosine schedule at its landmarks, the grad-norm helpers, and the
// offloaded update (nvme and host's copy path) against the plain one.
#include "engine/optim/adamw.h"
#include "engine/optim/adamw_kernel.h"

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using dtrain::engine::optim::AdamW;
using dtrain::engine::optim::AdamWOptions;
using dtrain::engine::optim::LrSchedule;

namespace {

// The reference: one scalar parameter's AdamW state, in double.
struct RefAdamW {
  double p, m = 0.0, v = 0.0;
  void step(double g, double lr, int64_t t, const AdamWOptions& o, bool decay) {
    if (decay) p *= 1.0 - lr * o.weight_decay;
    m = o.beta1 * m + (1.0 - o.beta1) * g;
    v = o.beta2 * v + (1.0 - o.beta2) * g * g;
    const double mhat = m / (1.0 - std::pow(o.beta1, double(t)));
    const double vhat = v / (1.0 - std::pow(o.beta2, double(t)));
    p -= lr * mhat / (std::sqrt(vhat) + o.eps);
  }
};

}  // namespace

TEST_CASE("adamw matches a scalar reference over several steps") {
  auto gen = at::detail::createCPUGenerator(17);
  AdamWOptions opt;
  opt.lr = 1e-2;
  opt.weight_decay = 0.1;
  std::vector<at::Tensor> params = {at::randn({7, 5}, gen, at::kFloat).requires_grad_(),
                                    at::randn({5}, gen, at::kFloat).requires_grad_(),
                                    at::randn({3}, gen, at::kFloat).requires_grad_()};
  std::vector<bool> decay = {true, false, true};
  // The third parameter never gets a gradient: it must not move.
  const at::Tensor untouched = params[2].detach().clone();
  std::vector<std::vector<RefAdamW>> ref(2);
  for (size_t i = 0; i < 2; ++i) {
    auto flat = params[i].detach().to(at::kDouble).flatten();
    for (int64_t j = 0; j < flat.numel(); ++j) ref[i].push_back({flat[j].item().toDouble()});
  }
  AdamW adamw(params, decay, opt);
  double max_diff = 0.0;
  for (int64_t t = 1; t <= 6; ++t) {
    const double lr = opt.lr * (t % 2 ? 1.0 : 0.5);  // the step's lr is the argument, not options.lr
    for (size_t i = 0; i < 2; ++i) {
      params[i].mutable_grad() = at::randn(params[i].sizes(), gen, at::kFloat);
      auto g = params[i].grad().to(at::kDouble).flatten();
      for (int64_t j = 0; j < g.numel(); ++j) ref[i][size_t(j)].step(g[j].item().toDouble(), lr, t, opt, decay[i]);
    }
    adamw.step(lr);
    for (size_t i = 0; i < 2; ++i) {
      auto got = params[i].detach().to(at::kDouble).flatten();
      for (int64_t j = 0; j < got.numel(); ++j) {
        max_diff = std::max(max_diff, std::abs(got[j].item().toDouble() - ref[i][size_t(j)].p));
      }
    }
  }
  std::printf("adamw vs fp64 reference: max |diff| = %.3g over 6 steps (tolerance 1e-6)\n", max_diff);
  CHECK(max_diff < 1e-6);
  CHECK(adamw.step_count() == 6);
  CHECK(at::equal(params[2].detach(), untouched));
  adamw.zero_grad();
  CHECK(params[0].grad().abs().sum().item().toDouble() == 0.0);
  CHECK(adamw.exp_avg().size() == 3);
  CHECK(adamw.exp_avg_sq()[0].sizes() == params[0].sizes());
}

TEST_CASE("adamw kernel: the prefetching loop gives a plain per-element loop's bits, tail included") {
  namespace k = dtrain::engine::optim::kernel;
  k::AdamWScalars s;
  s.decay = 1.0f - 3e-3f * 0.1f;
  s.b1 = 0.9f, s.one_minus_b1 = 0.1f, s.b2 = 0.999f, s.one_minus_b2 = 0.001f;
  s.bc2_sqrt = std::sqrt(1.0f - 0.999f * 0.999f);
  s.eps = 1e-8f;
  s.neg_step = -3e-3f / (1.0f - 0.9f * 0.9f);
  s.grad_scale = 0.75f;
  // The plain loop in this file; eps_shift moves eps (the negative control).
  auto plain = [&](std::vector<float>& p, const std::vector<float>& g, std::vector<float>& m, std::vector<float>& v,
                   float eps_shift) {
    for (size_t i = 0; i < p.size(); ++i) {
      const float gi = g[i] * s.grad_scale;
      const float pi = p[i] * s.decay;
      const float mi = m[i] * s.b1 + s.one_minus_b1 * gi;
      const float vi = v[i] * s.b2 + s.one_minus_b2 * gi * gi;
      const float denom = std::sqrt(vi) / s.bc2_sqrt + (s.eps + eps_shift);
      m[i] = mi;
      v[i] = vi;
      p[i] = pi + s.neg_step * (mi / denom);
    }
  };
  auto gen = at::detail::createCPUGenerator(41);
  // 3001: blocks of 16 with lines asked 512 ahead, then the last 521 plain;
  // 300: shorter than the look-ahead, all plain.
  for (int64_t n : {int64_t(3001), int64_t(300)}) {
    auto draw = [&](float scale) {
      at::Tensor t = at::randn({n}, gen, at::kFloat) * scale;
      return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + n);
    };
    std::vector<float> p = draw(1.0f), g = draw(1.0f), m = draw(0.1f), v = draw(0.01f);
    for (float& x : v) x = x * x;  // second moments are squares
    std::vector<float> p2 = p, m2 = m, v2 = v, p3 = p, m3 = m, v3 = v;
    k::adamw_run(p.data(), g.data(), m.data(), v.data(), n, s);
    plain(p2, g, m2, v2, 0.0f);
    plain(p3, g, m3, v3, 1e-3f);
    int64_t differ = 0, control = 0;
    for (int64_t i = 0; i < n; ++i) {
      differ += p[i] != p2[i] || m[i] != m2[i] || v[i] != v2[i];
      control += p[i] != p3[i];
    }
    std::printf("adamw kernel vs a plain loop, n %lld: %lld elements differ; negative control (eps + 1e-3): %lld\n",
                static_cast<long long>(n), static_cast<long long>(differ), static_cast<long long>(control));
    CHECK(differ == 0);
    CHECK(control > n / 10);
  }
}

TEST_CASE("adamw: the fused pass and the ATen ops give the same parameters") {
  auto gen = at::detail::createCPUGenerator(23);
  AdamWOptions fused_opt, aten_opt;
  fused_opt.lr = aten_opt.lr = 3e-3;
  aten_opt.fused = false;
  std::vector<at::Tensor> a = {at::randn({64, 33}, gen, at::kFloat), at::randn({97}, gen, at::kFloat)};
  std::vector<at::Tensor> b = {a[0].clone(), a[1].clone()};
  std::vector<at::Tensor> ga = {at::empty_like(a[0]), at::empty_like(a[1])};
  std::vector<at::Tensor> gb = {at::empty_like(a[0]), at::empty_like(a[1])};
  AdamW fused(a, {true, false}, fused_opt, ga), aten(b, {true, false}, aten_opt, gb);
  double max_rel = 0, moved = 0;
  for (int t = 1; t <= 8; ++t) {
    for (size_t i = 0; i < 2; ++i) {
      ga[i].copy_(at::randn(a[i].sizes(), gen, at::kFloat));
      gb[i].copy_(ga[i]);
    }
    fused.step(3e-3);
    aten.step(3e-3);
    for (size_t i = 0; i < 2; ++i) {
      max_rel = std::max(max_rel, ((a[i] - b[i]).abs() / b[i].abs().clamp_min(1e-3)).max().item<double>());
      moved = std::max(moved, (a[i] - b[i]).abs().max().item<double>());
    }
  }
  // Different fp32 rounding (ATen may contract to fused multiply-adds) stays
  // within a few ulps; a wrong formula moves parameters by ~lr = 3e-3.
  std::printf("adamw fused vs ATen ops: max rel diff %.3g, max abs diff %.3g over 8 steps (tolerance 1e-5)\n",
              max_rel, moved);
  CHECK(max_rel < 1e-5);
}

namespace {

// Max |difference| of the parameters of our fused CPU pass and the device
// path (ATen's _fused_adamw_, run on the CPU through device_path_on_cpu) after
// 8 steps on the same gradients with grad_scale 0.5 and both decay flags;
// device_lr_factor scales the device path's lr (the negative control).
double device_path_vs_fused(double device_lr_factor, int* device_loops) {
  auto gen = at::detail::createCPUGenerator(29);
  AdamWOptions ours, dev;
  ours.lr = dev.lr = 3e-3;
  dev.device_path_on_cpu = true;
  const std::vector<std::vector<int64_t>> shapes = {{64, 33}, {97}, {33, 5}, {7}};
  std::vector<at::Tensor> a, b, ga, gb;
  for (const auto& sh : shapes) {
    a.push_back(at::randn(sh, gen, at::kFloat));
    b.push_back(a.back().clone());
    ga.push_back(at::empty_like(a.back()));
    gb.push_back(at::empty_like(a.back()));
  }
  const std::vector<bool> decay = {true, false, true, false};
  AdamW x(a, decay, ours, ga), y(b, decay, dev, gb);
  for (int t = 1; t <= 8; ++t) {
    for (size_t i = 0; i < a.size(); ++i) {
      ga[i].copy_(at::randn(a[i].sizes(), gen, at::kFloat));
      gb[i].copy_(ga[i]);
    }
    x.step(3e-3, 0.5);
    y.step(3e-3 * device_lr_factor, 0.5);
  }
  *device_loops = y.last_step_loops();
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, (a[i] - b[i]).abs().max().item<double>());
  return most;
}

}  // namespace

TEST_CASE("adamw: the device path (ATen's fused multi-tensor AdamW, one call per decay group) gives the fused pass's parameters") {
  int loops = 0, control_loops = 0;
  const double d = device_path_vs_fused(1.0, &loops);
  const double control = device_path_vs_fused(1.5, &control_loops);
  std::printf("adamw device path (_fused_adamw_ on the CPU) vs our fused pass, 8 steps, grad_scale 0.5: max abs diff "
              "%.3g (tolerance 1e-6), %d call(s) per step; negative control (its lr x 1.5) %.3g\n",
              d, loops, control);
  CHECK(d <= 1e-6);
  CHECK(loops == 2);  // the decay group and the no-decay group
  CHECK(control >= 1e-4);
}

namespace {

// Params (and grads) as views of one flat buffer, like a ZeRO shard's pieces.
std::vector<at::Tensor> views_of(const at::Tensor& flat, const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& s : shapes) {
    const int64_t n = c10::multiply_integers(s);
    out.push_back(flat.narrow(0, offset, n).view(s));
    offset += n;
  }
  return out;
}

// Max |a - b| over the params of two AdamWs after the same 8 steps on the
// same random gradients; a steps a flat buffer with flat runs, b separate
// tensors with the per-tensor pass (flat_runs false, today's path).
struct FlatVsPerTensor {
  double max_abs = 0;
  int flat_loops = 0, tensor_loops = 0;
};

FlatVsPerTensor flat_vs_per_tensor(const std::vector<bool>& flat_decay, const std::vector<bool>& ref_decay) {
  const std::vector<std::vector<int64_t>> shapes = {{64, 33}, {97}, {33, 5}, {7}, {5, 3}};
  auto gen = at::detail::createCPUGenerator(29);
  int64_t total = 0;
  for (const auto& s : shapes) total += c10::multiply_integers(s);
  at::Tensor pf = at::randn({total}, gen, at::kFloat), gf = at::zeros({total});
  std::vector<at::Tensor> a = views_of(pf, shapes), ga = views_of(gf, shapes), b, gb;
  for (size_t i = 0; i < a.size(); ++i) {
    b.push_back(a[i].clone());  // separate storages: nothing lies end to end
    gb.push_back(at::zeros_like(a[i]));
  }
  AdamWOptions flat_opt, ref_opt;
  flat_opt.lr = ref_opt.lr = 3e-3;
  ref_opt.flat_runs = false;
  AdamW flat(a, flat_decay, flat_opt, ga), ref(b, ref_decay, ref_opt, gb);
  FlatVsPerTensor out;
  for (int t = 1; t <= 8; ++t) {
    gf.copy_(at::randn({total}, gen, at::kFloat));
    for (size_t i = 0; i < a.size(); ++i) gb[i].copy_(ga[i]);
    flat.step(3e-3);
    ref.step(3e-3);
    for (size_t i = 0; i < a.size(); ++i)
      out.max_abs = std::max(out.max_abs, (a[i] - b[i]).abs().max().item<double>());
  }
  out.flat_loops = flat.last_step_loops();
  out.tensor_loops = ref.last_step_loops();
  return out;
}

}  // namespace

TEST_CASE("adamw: flat runs over params lying end to end give the per-tensor pass's parameters") {
  // Decay flags split the five params into three runs: {0, 1}, {2, 3}, {4}.
  const std::vector<bool> decay = {true, true, false, false, true};
  const FlatVsPerTensor same = flat_vs_per_tensor(decay, decay);
  // Negative control: the per-tensor side decays param 2 too, as a run
  // merged across a decay boundary would; misses by ~lr * wd * |p| a step.
  const FlatVsPerTensor wrong = flat_vs_per_tensor(decay, {true, true, true, false, true});
  std::printf("adamw flat runs vs per-tensor pass: max abs diff %.3g over 8 steps (tolerance 1e-6), "
              "%d vs %d loops a step; negative control (one decay flag differs) %.3g\n",
              same.max_abs, same.flat_loops, same.tensor_loops, wrong.max_abs);
  CHECK(same.max_abs <= 1e-6);
  CHECK(same.flat_loops == 3);
  CHECK(same.tensor_loops == 5);
  CHECK(wrong.max_abs >= 1e-4);
}

namespace {

// Max |difference| of the parameters after `steps` AdamW steps with the
// moments offloaded as `off` (nvme: a file under /tmp) against the same steps
// without offload, from the same start and gradients. Five params of 37
// elements in buckets of 16: a piece of a param per bucket, 12 buckets, so
// the nvme store's three slots each come round four times a step.
double offload_vs_plain(dtrain::engine::optim::OffloadOptions off, int steps) {
  at::manual_seed(11);
  std::vector<at::Tensor> a, b;
  for (int i = 0; i < 5; ++i) {
    a.push_back(at::randn({37}).requires_grad_());
    b.push_back(a.back().detach().clone().requires_grad_());
  }
  const std::vector<bool> decay = {true, false, true, true, false};
  AdamWOptions o;
  o.lr = 1e-2;
  AdamW plain(a, decay, o);
  o.allocate_state = false;
  AdamW offloaded(b, decay, o);
  off.bucket_floats = 16;
  offloaded.offload(off, true);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < a.size(); ++i) {
      const at::Tensor g = at::randn({37});
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    plain.step(o.lr);
    offloaded.step(o.lr);
  }
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, (a[i].detach() - b[i].detach()).abs().max().item<double>());
  return most;
}

}  // namespace

TEST_CASE("adamw offload: nvme (reader and writer threads, three slots) and host's copy path match the plain update") {
  using dtrain::engine::optim::OffloadOptions;
  OffloadOptions nvme;
  nvme.file = "/tmp/dtrain-optim-test-" + std::to_string(::getpid()) + ".bin";
  OffloadOptions host;
  host.nvme = false;  // the CPU runs host's GPU path: master, gradients in, parameters out
  const double d_nvme = offload_vs_plain(nvme, 6), d_host = offload_vs_plain(host, 6);
  // Host's update split over a crew of 3 threads (a GPU rank's CPU Adam).
  OffloadOptions crew = host;
  crew.threads = 3;
  const double d_crew = offload_vs_plain(crew, 6);
  // Negative controls: the moments never written back; the master never copied back.
  nvme.drop_writes = true;
  host.drop_writes = true;
  const double c_nvme = offload_vs_plain(nvme, 6), c_host = offload_vs_plain(host, 6);
  crew.drop_writes = true;
  const double c_crew = offload_vs_plain(crew, 6);
  std::printf("adamw offload vs plain over 6 steps: nvme max abs diff %.3g, host %.3g, host on 3 threads %.3g "
              "(tolerance 1e-6); negative controls (no write-back / no copy back / 3 threads, no copy back) "
              "%.3g, %.3g, %.3g\n", d_nvme, d_host, d_crew, c_nvme, c_host, c_crew);
  CHECK(d_nvme <= 1e-6);
  CHECK(d_host <= 1e-6);
  CHECK(d_crew <= 1e-6);
  CHECK(c_crew >= 1e-4);
  CHECK(c_nvme >= 1e-4);
  CHECK(c_host >= 1e-4);
}

namespace {

// Max |difference| of the parameters of two AdamWs after 6 steps on the same
// gradients: one given grad_scale and the gradients as they are (`inside`),
// the other the gradients scaled in place first (scale_grads, the clip's
// former pass) and grad_scale 1; `path` picks the update both take. Also
// whether `inside` left its gradients unscaled.
struct ScaleInside {
  double max_abs = 0;
  bool grads_kept = true;
};

enum class Path { flat_runs, per_tensor, aten, nvme };

ScaleInside scale_inside(Path path, double scale, double inside_scale) {
  auto gen = at::detail::createCPUGenerator(31);
  const std::vector<std::vector<int64_t>> shapes = {{64, 33}, {97}, {33, 5}};
  int64_t total = 0;
  for (const auto& s : shapes) total += c10::multiply_integers(s);
  at::Tensor pa = at::randn({total}, gen, at::kFloat), pb = pa.clone();
  at::Tensor ga = at::zeros({total}), gb = at::zeros({total});
  std::vector<at::Tensor> a = views_of(pa, shapes), b = views_of(pb, shapes);
  std::vector<at::Tensor> gav = views_of(ga, shapes), gbv = views_of(gb, shapes);
  AdamWOptions o;
  o.lr = 3e-3;
  o.eps = 0.5;  // of the gradients' order: AdamW's step then depends on their scale
  o.flat_runs = path == Path::flat_runs;
  o.fused = path != Path::aten;
  o.allocate_state = path != Path::nvme;
  AdamW inside(a, {true, false, true}, o, gav), outside(b, {true, false, true}, o, gbv);
  if (path == Path::nvme) {
    dtrain::engine::optim::OffloadOptions off;
    off.bucket_floats = 100;
    off.file = "/tmp/dtrain-optim-scale-a-" + std::to_string(::getpid()) + ".bin";
    inside.offload(off, true);
    off.file = "/tmp/dtrain-optim-scale-b-" + std::to_string(::getpid()) + ".bin";
    outside.offload(off, true);
  }
  ScaleInside out;
  for (int t = 1; t <= 6; ++t) {
    ga.copy_(at::randn({total}, gen, at::kFloat));
    gb.copy_(ga);
    const at::Tensor given = ga.clone();
    inside.step(3e-3, inside_scale);
    dtrain::engine::optim::scale_grads(gbv, scale);
    outside.step(3e-3);
    out.grads_kept = out.grads_kept && at::equal(ga, given);
  }
  out.max_abs = (pa - pb).abs().max().item<double>();
  return out;
}

}  // namespace

TEST_CASE("adamw: the clip factor applied inside the update gives the bits of the gradients scaled first") {
  const double scale = 0.37;  // a clip factor: max_norm / (norm + eps) < 1
  const char* names[] = {"flat runs", "per tensor", "ATen ops", "nvme offload"};
  int k = 0;
  for (Path path : {Path::flat_runs, Path::per_tensor, Path::aten, Path::nvme}) {
    const ScaleInside same = scale_inside(path, scale, scale);
    // Negative control: the factor dropped (grad_scale 1) on the inside.
    const ScaleInside dropped = scale_inside(path, scale, 1.0);
    std::printf("adamw grad_scale inside vs gradients scaled first, %s: max abs diff %.3g over 6 steps "
                "(tolerance 0: the same bits); gradients left unscaled: %s; negative control (factor "
                "dropped) %.3g\n",
                names[k++], same.max_abs, same.grads_kept ? "yes" : "no", dropped.max_abs);
    CHECK(same.max_abs == 0.0);
    CHECK(dropped.max_abs >= 1e-5);
    // The fused paths read the factor in the loop; the ATen ops scale in place.
    CHECK(same.grads_kept == (path != Path::aten));
  }
}

TEST_CASE("lr schedule: linear warmup, then cosine to min_lr at the last step") {
  LrSchedule s;
  s.lr = 1e-3;
  s.min_lr = 1e-4;
  s.warmup_steps = 10;
  s.total_steps = 111;  // cosine over steps 10..110 (span 100)
  CHECK(s.at(0) == doctest::Approx(1e-4));       // 1/10 of lr
  CHECK(s.at(4) == doctest::Approx(5e-4));
  CHECK(s.at(9) == doctest::Approx(1e-3));       // end of warmup: peak
  CHECK(s.at(10) == doctest::Approx(1e-3));      // cosine starts at lr
  CHECK(s.at(60) == doctest::Approx(5.5e-4));    // halfway: (lr + min_lr) / 2
  CHECK(s.at(110) == doctest::Approx(1e-4));     // last step: min_lr
  CHECK(s.at(500) == doctest::Approx(1e-4));     // after the end: min_lr
  for (int64_t k = 10; k < 110; ++k) CHECK(s.at(k + 1) <= s.at(k));  // monotone decay
  LrSchedule flat;
  flat.lr = 2e-3;
  flat.min_lr = 2e-3;
  flat.warmup_steps = 0;
  flat.total_steps = 5;
  CHECK(flat.at(0) == doctest::Approx(2e-3));
  CHECK(flat.at(4) == doctest::Approx(2e-3));
}

TEST_CASE("grad norm helpers: sum of squares and scaling") {
  std::vector<at::Tensor> grads = {at::full({2, 2}, 3.0f), at::full({3}, -2.0f), at::Tensor()};
  CHECK(dtrain::engine::optim::local_grad_sq_norm(grads) == doctest::Approx(4 * 9.0 + 3 * 4.0));
  dtrain::engine::optim::scale_grads(grads, 0.5);
  CHECK(grads[0][0][0].item().toDouble() == doctest::Approx(1.5));
  CHECK(grads[1][2].item().toDouble() == doctest::Approx(-1.0));
}

TEST_CASE("grad norm: the sums off the fp32 loop fetched in one copy per device") {
  // On a GPU every gradient's fp64 sum stays on the device and one .item()
  // fetches them all; batch_on_cpu runs that path on these CPU tensors
  // (bf16, fp64, a transposed view: none takes the fp32 loop).
  at::manual_seed(11);
  std::vector<at::Tensor> grads = {at::randn({300}).to(at::kBFloat16), at::randn({7, 5}, at::kDouble),
                                   at::randn({64, 48}).t(), at::Tensor(), at::randn({1000})};
  const double one_by_one = dtrain::engine::optim::local_grad_sq_norm(grads);
  const double batched = dtrain::engine::optim::local_grad_sq_norm(grads, /*batch_on_cpu=*/true);
  const double rel = std::abs(batched - one_by_one) / one_by_one;
  MESSAGE("sum of squares one .item() per tensor " << one_by_one << ", one per device " << batched
                                                   << ": rel diff " << rel);
  CHECK(rel < 1e-14);
  // Negative control: a gradient left out misses by its whole square.
  std::vector<at::Tensor> fewer(grads.begin() + 1, grads.end());
  const double missing = std::abs(dtrain::engine::optim::local_grad_sq_norm(fewer, true) - one_by_one) / one_by_one;
  MESSAGE("control (the bf16 gradient left out): rel diff " << missing);
  CHECK(missing > 1e-2);
  // scale_grads: every dtype scaled in place, undefined ones skipped.
  std::vector<at::Tensor> before;
  for (const auto& g : grads) before.push_back(g.defined() ? g.clone() : g);
  dtrain::engine::optim::scale_grads(grads, 0.25);
  for (size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined()) CHECK(at::equal(grads[i], before[i] * 0.25));
}

TEST_CASE("grad norm: the one-pass fp32 loop agrees with an fp64 sum, for any length and layout") {
  at::manual_seed(7);
  // Lengths around the loop's 8-wide body and its 32-element quarters, a large bucket, and a
  // non-contiguous view (which takes ATen's path).
  std::vector<at::Tensor> grads;
  for (int64_t n : {1, 7, 8, 9, 31, 32, 33, 1000003}) grads.push_back(at::randn({n}) * 3.0);
  grads.push_back(at::randn({64, 48}).t());
  double fast = dtrain::engine::optim::local_grad_sq_norm(grads);
  double ref = 0;
  for (const auto& g : grads) ref += g.to(at::kDouble).pow(2).sum().item().toDouble();
  const double rel = std::abs(fast - ref) / ref;
  MESSAGE("sum of squares " << fast << " vs fp64 reference " << ref << ": rel diff " << rel);
  CHECK(rel < 1e-12);
  // Exactly the bits of the loop's order written out here (the first 4q
  // elements as four quarters, element i of quarter s into accumulator
  // [s][i % 8], the rest into [0][0]; each quarter ((0+1)+(2+3))+((4+5)+(6+7)),
  // then (s0+s1)+(s2+s3)), whichever clone (AVX2 or baseline) the CPU runs.
  const std::vector<at::Tensor> contiguous(grads.begin(), grads.end() - 1);  // the last is a transposed view
  double ordered = 0;
  for (const auto& g : contiguous) {
    const float* x = g.const_data_ptr<float>();
    const int64_t n = g.numel(), q = (n / 32) * 8;
    double acc[4][8] = {};
    for (int64_t i = 0; i < n; ++i) {
      double& a = i < 4 * q ? acc[i / q][(i % q) % 8] : acc[0][0];
      a += double(x[i]) * double(x[i]);
    }
    double part[4];
    for (int s = 0; s < 4; ++s)
      part[s] = ((acc[s][0] + acc[s][1]) + (acc[s][2] + acc[s][3])) + ((acc[s][4] + acc[s][5]) + (acc[s][6] + acc[s][7]));
    ordered += (part[0] + part[1]) + (part[2] + part[3]);
  }
  const double fast_contiguous = dtrain::engine::optim::local_grad_sq_norm(contiguous);
  MESSAGE("contiguous grads: loop " << fast_contiguous << " vs the same order written out " << ordered
                                    << ": diff " << fast_contiguous - ordered << " (want 0)");
  CHECK(fast_contiguous == ordered);
  // Not a no-op: one element changed moves it by exactly that element's square.
  grads[1][3] = grads[1][3] + 1.0;
  double ref2 = 0;
  for (const auto& g : grads) ref2 += g.to(at::kDouble).pow(2).sum().item().toDouble();
  CHECK(std::abs(dtrain::engine::optim::local_grad_sq_norm(grads) - ref2) / ref2 < 1e-12);
  CHECK(std::abs(ref2 - ref) > 1e-3);
}
