// ParamInit and normal_range (param_init.h). The skipping must consume the
// generator exactly like at::normal_ on the whole tensor; param_init_test
// compares both, element for element and by the next draw.
#include "engine/model/param_init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace dtrain::engine::model {
namespace {

constexpr double kGptInitStd = 0.02;    // GPT-2's weight init
constexpr double kLlamaInitStd = 0.02;  // transformers' initializer_range
constexpr int64_t kChunk = int64_t(1) << 22;  // elements drawn at once (16 MiB), a multiple of 16
constexpr int64_t kThreadChunk = int64_t(1) << 20;  // a thread's share at a time (4 MiB), a multiple of 16

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// n raw 32-bit draws: what n float uniforms consume. On a copy of the
// generator's engine (CPUGeneratorImpl::random is that engine's next draw,
// an out-of-line call each; the copy's is inlined), set back after.
void skip_draws(int64_t n, at::Generator& gen) {
  auto* g = at::check_generator<at::CPUGeneratorImpl>(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::mt19937 engine = g->engine();
  for (int64_t i = 0; i < n; ++i) (void)engine();
  g->set_engine(engine);
}

// One chunk's draw: elements [c, c1) of the flat tensor from `gen` (placed
// at element c of the stream), its [a, b) part written to flat.
void draw_chunk(at::Tensor& flat, int64_t begin, int64_t c, int64_t c1, int64_t a, int64_t b, double mean,
                double std, at::Generator& gen) {
  at::Tensor chunk = at::empty({c1 - c}, flat.options());
  chunk.normal_(mean, std, gen);
  flat.narrow(0, a - begin, b - a).copy_(chunk.narrow(0, a - c, b - a));
}

// Draws flat elements [lo, hi) (hi - lo a multiple of 16, drawn as blocks
// of 16 from lo) into whatever part of [begin, begin + flat.numel()) they
// cover; chunks outside it only advance the generator.
// threads > 1: this thread walks the stream alone, leaving a copy of the
// generator at the start of every chunk to draw (a raw draw costs about a
// quarter of a normal: the uniforms, then Box-Muller), while the other threads
// draw the chunks already placed from their copies; the walk done, this
// thread draws too. Each chunk consumes exactly the draws it would serially,
// so every count gives the same numbers.
void draw_aligned(at::Tensor& flat, int64_t begin, int64_t lo, int64_t hi, double mean, double std,
                  at::Generator& gen, int threads) {
  const int64_t end = begin + flat.numel();
  const int64_t step = threads > 1 ? kThreadChunk : kChunk;
  const auto covers = [&](int64_t c) { return std::max(c, begin) < std::min(std::min(hi, c + step), end); };
  size_t total = 0;
  if (threads > 1)
    for (int64_t c = lo; c < hi; c += step) total += covers(c);
  if (total < 2) threads = 1;  // nothing to share
  struct Job {
    at::Generator gen;
    int64_t c = 0, c1 = 0, a = 0, b = 0;
  };
  std::vector<Job> jobs(threads > 1 ? total : 0);
  std::atomic<size_t> placed{0}, next{0}, limit{total};
  std::mutex failed_mu;
  std::exception_ptr failed;
  const auto work = [&] {
    c10::NoGradGuard no_grad;  // grad mode is per thread
    for (size_t j; (j = next.fetch_add(1)) < limit.load();) {
      while (placed.load(std::memory_order_acquire) <= j) {  // the walk has not reached it yet
        if (j >= limit.load()) return;
        std::this_thread::yield();
      }
      try {
        Job& job = jobs[j];  // this thread's alone
        draw_chunk(flat, begin, job.c, job.c1, job.a, job.b, mean, std, job.gen);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failed_mu);
        if (!failed) failed = std::current_exception();
      }
    }
  };
  std::vector<std::thread> crew;
  for (int t = 1; t < threads; ++t) crew.emplace_back(work);
  size_t k = 0;
  try {
    for (int64_t c = lo; c < hi; c += step) {
      const int64_t c1 = std::min(hi, c + step);
      const int64_t a = std::max(c, begin), b = std::min(c1, end);
      if (a < b && threads <= 1) {
        draw_chunk(flat, begin, c, c1, a, b, mean, std, gen);
        continue;
      }
      if (a < b) {
        {
          std::lock_guard<std::mutex> lock(gen.mutex());
          jobs[k] = {gen.clone(), c, c1, a, b};
        }
        placed.store(++k, std::memory_order_release);
      }
      skip_draws(c1 - c, gen);
    }
  } catch (...) {
    limit.store(k);  // the threads stop at what was placed
    for (auto& t : crew) t.join();
    throw;
  }
  if (threads <= 1) return;
  work();
  for (auto& t : crew) t.join();
  if (failed) std::rethrow_exception(failed);
}

}  // namespace

void normal_range(at::Tensor& out, int64_t n, int64_t begin, double mean, double std, at::Generator& gen,
                  int threads) {
  c10::NoGradGuard no_grad;
  at::Tensor flat = out.view({-1});
  if (n < 16) {  // ATen's serial path (it may keep a spare normal in the generator): draw it all
    at::Tensor all = at::empty({n}, out.options());
    all.normal_(mean, std, gen);
    flat.copy_(all.narrow(0, begin, flat.numel()));
    return;
  }
  const int64_t full = n / 16 * 16;
  draw_aligned(flat, begin, 0, full, mean, std, gen, threads);
  if (n % 16 == 0) return;
  // The kernel's tail: the partial block's uniforms are drawn and then
  // overwritten by 16 fresh ones for the last 16 elements.
  skip_draws(n - full, gen);
  draw_aligned(flat, begin, n - 16, n, mean, std, gen, 1);  // one block of 16 (n - 16 need not be aligned)
}

void skip_normal(int64_t n, at::Generator& gen) {
  if (n < 16) {
    at::Tensor all = at::empty({n});
    all.normal_(0.0, 1.0, gen);
    return;
  }
  skip_draws(n + (n % 16 != 0 ? 16 : 0), gen);
}

ParamInit::ParamInit(uint64_t seed, bool llama, int layers, int threads)
    : gen_(at::detail::createCPUGenerator(seed)),
      llama_(llama),
      proj_std_(kGptInitStd / std::sqrt(2.0 * layers)),
      threads_(std::max(1, threads)) {}

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
    case Rule::normal:
      if (threads_ > 1 && p.is_contiguous() && p.numel() > kThreadChunk)
        normal_range(p, p.numel(), 0, 0.0, std, gen_, threads_);  // the same numbers, drawn by threads_
      else
        p.normal_(0.0, std, gen_);
      break;
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
      normal_range(p, n, row_begin * row, 0.0, std, gen_, threads_);
      break;
    }
  }
}

void ParamInit::skip(const std::string& name, int64_t n) {
  double std = 0;
  if (rule(name, std) == Rule::normal) skip_normal(n, gen_);
}

}  // namespace dtrain::engine::model
