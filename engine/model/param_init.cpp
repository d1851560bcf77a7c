// ParamInit and normal_range (param_init.h). The skipping must consume the
// generator exactly like at::normal_ on the whole tensor; param_init_test
// compares both, element for element and by the next draw.
#include "engine/model/param_init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <mutex>

namespace dtrain::engine::model {
namespace {

constexpr double kGptInitStd = 0.02;    // GPT-2's weight init
constexpr double kLlamaInitStd = 0.02;  // transformers' initializer_range
constexpr int64_t kChunk = int64_t(1) << 22;  // elements drawn at once (16 MiB), a multiple of 16

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// n raw 32-bit draws: what n float uniforms consume.
void skip_draws(int64_t n, at::Generator& gen) {
  auto* g = at::check_generator<at::CPUGeneratorImpl>(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  for (int64_t i = 0; i < n; ++i) (void)g->random();
}

// Draws flat elements [lo, hi) (hi - lo a multiple of 16, drawn as blocks
// of 16 from lo) into whatever part of [begin, begin + flat.numel()) they
// cover; chunks outside it only advance the generator.
void draw_aligned(at::Tensor& flat, int64_t begin, int64_t lo, int64_t hi, double mean, double std,
                  at::Generator& gen) {
  const int64_t end = begin + flat.numel();
  for (int64_t c = lo; c < hi; c += kChunk) {
    const int64_t c1 = std::min(hi, c + kChunk);
    const int64_t a = std::max(c, begin), b = std::min(c1, end);
    if (a >= b) {
      skip_draws(c1 - c, gen);
      continue;
    }
    at::Tensor chunk = at::empty({c1 - c}, flat.options());
    chunk.normal_(mean, std, gen);
    flat.narrow(0, a - begin, b - a).copy_(chunk.narrow(0, a - c, b - a));
  }
}

}  // namespace

void normal_range(at::Tensor& out, int64_t n, int64_t begin, double mean, double std, at::Generator& gen) {
  c10::NoGradGuard no_grad;
  at::Tensor flat = out.view({-1});
  if (n < 16) {  // ATen's serial path (it may keep a spare normal in the generator): draw it all
    at::Tensor all = at::empty({n}, out.options());
    all.normal_(mean, std, gen);
    flat.copy_(all.narrow(0, begin, flat.numel()));
    return;
  }
  const int64_t full = n / 16 * 16;
  draw_aligned(flat, begin, 0, full, mean, std, gen);
  if (n % 16 == 0) return;
  // The kernel's tail: the partial block's uniforms are drawn and then
  // overwritten by 16 fresh ones for the last 16 elements.
  skip_draws(n - full, gen);
  draw_aligned(flat, begin, n - 16, n, mean, std, gen);  // one block of 16 (n - 16 need not be aligned)
}

void skip_normal(int64_t n, at::Generator& gen) {
  if (n < 16) {
    at::Tensor all = at::empty({n});
    all.normal_(0.0, 1.0, gen);
    return;
  }
  skip_draws(n + (n % 16 != 0 ? 16 : 0), gen);
}

ParamInit::ParamInit(uint64_t seed, bool llama, int layers)
    : gen_(at::detail::createCPUGenerator(seed)),
      llama_(llama),
      proj_std_(kGptInitStd / std::sqrt(2.0 * layers)) {}

// GPT-2 style: N(0, 0.02) weights; residual projections (attn.proj and
// mlp.proj) scaled by 1/sqrt(2 * layers); zero biases; LayerNorm 1 / 0.
// Llama (transformers' LlamaPreTrainedModel): every weight N(0, 0.02), no
// scaled projections, RMSNorm weights 1.
ParamInit::Rule ParamInit::rule(const std::string& name, double& std) const {
  const bool is_norm = name.rfind("ln_f.", 0) == 0 || name.find(".ln1.") != std::string::npos ||
                       name.find(".ln2.") != std::string::npos;
  std = llama_ ? kLlamaInitStd : kGptInitStd;
  if (llama_) return is_norm ? Rule::one : Rule::normal;
  if (ends_with(name, ".bias")) return Rule::zero;
  if (is_norm) return Rule::one;
  if (ends_with(name, "proj.weight")) std = proj_std_;
  return Rule::normal;
}

void ParamInit::whole(const std::string& name, at::Tensor& p) {
  c10::NoGradGuard no_grad;
  double std = 0;
  switch (rule(name, std)) {
    case Rule::zero: p.zero_(); break;
    case Rule::one: p.fill_(1.0); break;
    case Rule::normal: p.normal_(0.0, std, gen_); break;
  }
}

void ParamInit::rows(const std::string& name, at::Tensor& p, int64_t n, int64_t row_begin) {
  c10::NoGradGuard no_grad;
  double std = 0;
  switch (rule(name, std)) {
    case Rule::zero: p.zero_(); break;
    case Rule::one: p.fill_(1.0); break;
    case Rule::normal: {
      const int64_t row = p.size(0) > 0 ? p.numel() / p.size(0) : 0;
      normal_range(p, n, row_begin * row, 0.0, std, gen_);
      break;
    }
  }
}

void ParamInit::skip(const std::string& name, int64_t n) {
  double std = 0;
  if (rule(name, std) == Rule::normal) skip_normal(n, gen_);
}

}  // namespace dtrain::engine::model
