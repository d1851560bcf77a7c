// The cost model's GPT (plan/gpt_params.h) is the engine's: every named
// parameter of engine/model's Gpt, in registration order, with the name and
// element count plan/ states for it, dense and with MoE blocks. A tensor
// added to the model without its line in plan/ fails here.
#include "engine/model/gpt.h"

#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "plan/gpt_params.h"

namespace {

using Named = std::vector<std::pair<std::string, int64_t>>;

// What plan/ says the whole model holds (tp 1), named as the engine names it:
// blocks.<i>. before a block's tensors; a MoE block's E experts stored as one
// [E, out, in] tensor per expert tensor.
Named plan_tensors(const dtrain::ModelSpec& m) {
  namespace pl = dtrain::plan;
  Named out;
  for (const auto& t : pl::embedding_tensors(m)) out.emplace_back(t.name, t.rows * t.cols);
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    for (const auto& t : pl::block_tensors(m, l)) out.emplace_back(b + t.name, t.rows * t.cols);
    if (pl::is_moe_block(m, l))
      for (const auto& t : pl::expert_tensors(m)) out.emplace_back(b + t.name, m.moe.experts * t.rows * t.cols);
  }
  for (const auto& t : pl::head_tensors(m)) out.emplace_back(t.name, t.rows * t.cols);
  return out;
}

Named engine_tensors(const dtrain::ModelSpec& m) {
  dtrain::engine::model::GptConfig c;
  c.vocab = m.vocab, c.layers = m.layers, c.d_model = m.d_model, c.heads = m.heads, c.seq_len = m.seq_len;
  c.moe.experts = m.moe.experts, c.moe.top_k = m.moe.top_k, c.moe.every = m.moe.every, c.moe.d_ff = m.moe.d_ff;
  dtrain::engine::model::Gpt gpt(c, 1);
  Named out;
  for (const auto& item : gpt->named_parameters()) out.emplace_back(item.key(), item.value().numel());
  return out;
}

}  // namespace

TEST_CASE("plan's GPT tensors are the engine's: names and sizes, dense and MoE") {
  const std::vector<std::vector<std::string>> specs = {
      {"model.layers=3", "model.d_model=32", "model.seq_len=16"},
      {"model.layers=3", "model.d_model=32", "model.seq_len=16", "model.moe.experts=4", "model.moe.top_k=2",
       "model.moe.every=2", "model.moe.d_ff=48"}};
  for (const auto& sets : specs) {
    const dtrain::JobSpec s = dtrain::parse_job_spec("", "s.yaml", sets);
    const Named want = plan_tensors(s.model), got = engine_tensors(s.model);
    CAPTURE(s.model.moe.experts);
    CHECK(got.size() == want.size());
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      CAPTURE(i);
      CHECK(got[i].first == want[i].first);
      CHECK(got[i].second == want[i].second);
    }
  }
}
