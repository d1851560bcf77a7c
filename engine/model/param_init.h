// The model's deterministic initialisation, one parameter at a time: one
// CPU generator seeded with job.seed draws every parameter in registration
// order (GPT-2's or transformers' llama rules), so any process, whatever part
// of the model it builds, holds the 1-process model's numbers. Owns the
// rules and the generator's stream; not which parameters a rank keeps (gpt.h's BuildScope).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace dtrain::engine::model {

// Elements [begin, begin + out.numel()) of the flat tensor of `n` elements
// that `at::normal_(mean, std, gen)` would draw, written to `out`
// (contiguous), the generator left where drawing all n leaves it. No tensor
// of n elements is allocated: elements outside the range are skipped in
// chunks (ATen's CPU kernel for n >= 16 draws n uniforms, Box-Muller in
// blocks of 16, then 16 more for the last 16 when n % 16 != 0).
// threads > 1 draws the chunks on that many threads, from copies of the
// generator placed at each chunk's start: the same numbers for any count.
void normal_range(at::Tensor& out, int64_t n, int64_t begin, double mean, double std, at::Generator& gen,
                  int threads = 1);

// Advances the generator exactly as drawing `n` normals does (no output).
void skip_normal(int64_t n, at::Generator& gen);

class ParamInit {
 public:
  // threads: how many threads draw a large parameter (the same numbers for
  // any count).
  ParamInit(uint64_t seed, bool llama, int layers, int threads = 1);
  // Draws `p` (the whole parameter `name`) as the rules say.
  void whole(const std::string& name, at::Tensor& p);
  // `p` holds rows [row_begin, row_begin + p.size(0)) of dim 0 of the
  // parameter `name` of `n` elements; draws them, skipping the others.
  void rows(const std::string& name, at::Tensor& p, int64_t n, int64_t row_begin);
  // The parameter of `n` elements is not kept here: only the stream moves.
  void skip(const std::string& name, int64_t n);

 private:
  enum class Rule { zero, one, normal };
  Rule rule(const std::string& name, double& std) const;
  at::Generator gen_;
  bool llama_;
  double proj_std_;
  int threads_ = 1;
};

}  // namespace dtrain::engine::model
