// Unit tests of plan/gpt_params.h against formulas written out by hand here
// (legend: C = d_model, V = vocab, T = seq_len, L = layers, E = experts,
// F = an expert's hidden width, t = tp): the whole model, dense and MoE, a
// tp rank's units with and without a vocab-parallel head, and the counts
// model_size and the traffic model read from it. That the engine builds
// these very tensors: tests/unit/engine/gpt_params_match_test.cpp.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "plan/gpt_params.h"
#include "plan/model_size.h"
#include "plan/traffic.h"

namespace {

dtrain::JobSpec spec_with(const std::vector<std::string>& sets) { return dtrain::parse_job_spec("", "s.yaml", sets); }

}  // namespace

TEST_CASE("gpt params: whole model, dense and MoE, by hand") {
  using namespace dtrain::plan;
  const double C = 64, V = 256, T = 32, L = 5, E = 4, F = 96;
  const dtrain::JobSpec dense = spec_with({"model.d_model=64", "model.layers=5", "model.seq_len=32"});
  const double block = 12 * C * C + 13 * C, outside = 2 * V * C + T * C + 2 * C;
  CHECK(param_count(dense.model).total() == outside + L * block);
  CHECK(param_count(dense.model).experts == 0);
  CHECK(model_size(dense).params == outside + L * block);
  // MoE every 2nd block from block 0: blocks 0, 2, 4 (3 of 5) trade the MLP for a router and E experts.
  const dtrain::JobSpec moe = spec_with({"model.d_model=64", "model.layers=5", "model.seq_len=32",
                                         "model.moe.experts=4", "model.moe.every=2", "model.moe.d_ff=96"});
  CHECK(moe_block_count(moe.model) == 3);
  CHECK(is_moe_block(moe.model, 2));
  CHECK_FALSE(is_moe_block(moe.model, 3));
  const ParamCount p = param_count(moe.model);
  CHECK(p.dense == outside + L * block + 3 * (C * E - (8 * C * C + 5 * C)));
  CHECK(p.experts == 3 * E * (2 * C * F + F + C));
  CHECK(model_size(moe).params == p.dense + p.experts);
  // The traffic model's dp gradients: the dense parameters (a MoE block's
  // router in place of its MLP, no expert); edp reduces the experts.
  CHECK(double(traffic_model_from_spec(moe).params) == p.dense);
  CHECK(double(traffic_model_from_spec(moe).expert_params) == 2 * C * F + F + C);
  CHECK(traffic_model_from_spec(moe).moe_layers == 3);
}

TEST_CASE("gpt params: a tp rank's units") {
  using namespace dtrain::plan;
  const int64_t C = 64, V = 256, T = 32, t = 2;
  const dtrain::JobSpec s = spec_with({"model.d_model=64", "model.seq_len=32", "cluster.procs_per_node=2",
                                       "parallel.tp=2"});
  const TpView view = tp_view(s);
  CHECK(view.tp == t);
  CHECK(view.vocab_parallel);
  // Column-parallel qkv and fc (weights and biases), row-parallel proj
  // weights split; LayerNorms and the row-parallel biases whole.
  CHECK(rank_numel(block_tensors(s.model, 0), view) ==
        4 * C + (3 * C * C + 3 * C) / t + C * C / t + C + (4 * C * C + 4 * C) / t + 4 * C * C / t + C);
  CHECK(rank_numel(embedding_tensors(s.model), view) == V * C / t + T * C);
  CHECK(rank_numel(head_tensors(s.model), view) == 2 * C + V * C / t);
  // A replicated vocabulary keeps wte and head whole.
  dtrain::JobSpec replicated = s;
  replicated.model.tp_vocab = dtrain::TpVocab::replicated;
  CHECK(rank_numel(head_tensors(s.model), tp_view(replicated)) == 2 * C + V * C);
  // tp 1: the whole unit.
  CHECK(rank_numel(block_tensors(s.model, 0), TpView{}) == 12 * C * C + 13 * C);
}
