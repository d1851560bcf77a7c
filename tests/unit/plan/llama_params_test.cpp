// Unit tests of the planner's llama (plan/gpt_params.h, llama_params.cpp,
// memory_plan.h, flops.h, traffic.h) against formulas written out by hand
// here. Legend: C = d_model, V = vocab, L = layers, H = heads, KV = kv
// heads, D = C / H, F = ffn_hidden, Fe = an expert's hidden width,
// E = experts, t = tp, s = seq_len, b = micro_batch. A llama block is
// 2C (RMSNorms) + C*C (q) + 2*KV*D*C (kv) + C*C (proj) + 3*C*F (gate_up,
// proj): no biases; outside the blocks V*C (wte), C (ln_f), V*C (head,
// absent when tied). That Hugging Face counts the same:
// tests/integration/llama_plan_test.cpp.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "plan/combinations.h"
#include "plan/flops.h"
#include "plan/gpt_params.h"
#include "plan/memory_plan.h"
#include "plan/model_size.h"
#include "plan/traffic.h"

namespace {

using namespace dtrain::plan;

dtrain::JobSpec spec_with(const std::vector<std::string>& sets) { return dtrain::parse_job_spec("", "s.yaml", sets); }

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Published architectures (config.json of meta-llama/Meta-Llama-3-8B,
// -70B and mistralai/Mixtral-8x7B-v0.1).
const std::vector<std::string> kLlama3_8b = {"model.kind=llama", "model.vocab=128256", "model.d_model=4096",
                                             "model.layers=32",  "model.heads=32",     "model.kv_heads=8",
                                             "model.ffn_hidden=14336"};
const std::vector<std::string> kLlama3_70b = {"model.kind=llama", "model.vocab=128256", "model.d_model=8192",
                                              "model.layers=80",  "model.heads=64",     "model.kv_heads=8",
                                              "model.ffn_hidden=28672"};
const std::vector<std::string> kMixtral = {"model.kind=llama",   "model.vocab=32000",  "model.d_model=4096",
                                           "model.layers=32",    "model.heads=32",     "model.kv_heads=8",
                                           "model.moe.experts=8", "model.moe.top_k=2", "model.moe.d_ff=14336"};

double llama_block(double C, double KV, double D, double F) { return 2 * C + 2 * C * C + 2 * KV * D * C + 3 * C * F; }

}  // namespace

TEST_CASE("llama params: Llama 3 8B, 70B and Mixtral 8x7B exactly, by hand and as published") {
  const double p8 = param_count(spec_with(kLlama3_8b).model).total();
  CHECK(p8 == 2 * 128256.0 * 4096 + 32 * llama_block(4096, 8, 128, 14336) + 4096);
  CHECK(p8 == 8030261248.0);
  CHECK(param_count(spec_with(kLlama3_70b).model).total() == 70553706496.0);
  const ParamCount mix = param_count(spec_with(kMixtral).model);
  // A Mixtral block: the attention and norms, a router E*C, E SwiGLU experts of 3*C*Fe.
  const double attention = 2 * 4096.0 + 2 * 4096.0 * 4096 + 2 * 8 * 128.0 * 4096;
  CHECK(mix.experts == 32 * 8 * 3 * 4096.0 * 14336);
  CHECK(mix.dense == 2 * 32000.0 * 4096 + 32 * (attention + 8 * 4096.0) + 4096);
  CHECK(mix.total() == 46702792704.0);
  CHECK(model_size(spec_with(kMixtral)).params == 46702792704.0);
  // Tied: no head; the GPT is not changed by the llama-only fields' defaults.
  const dtrain::JobSpec tied = spec_with(with(kLlama3_8b, {"model.tie_embeddings=true"}));
  CHECK(param_count(tied.model).total() == p8 - 128256.0 * 4096);
  CHECK(param_count(spec_with({"model.d_model=64"}).model).total() == 2 * 256 * 64 + 64 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64);
  // The builtin engine's rules accept a llama (model.kind is the validator's to check).
  CHECK(combination_problems(spec_with(kLlama3_8b)).empty());
}

TEST_CASE("llama params: a tp rank's units; kv heads split (KV % t == 0) or replicated (t % KV == 0)") {
  const int64_t C = 64, V = 256, H = 8, D = C / H, F = 96;
  auto block_on_rank = [&](int kv, int t) {
    const dtrain::JobSpec s = spec_with({"model.kind=llama", "model.d_model=64", "model.heads=8",
                                         "model.kv_heads=" + std::to_string(kv), "model.ffn_hidden=96",
                                         "cluster.procs_per_node=" + std::to_string(t),
                                         "parallel.tp=" + std::to_string(t)});
    return rank_numel(block_tensors(s.model, 0), tp_view(s));
  };
  // q, proj, gate_up and mlp.proj split over t; the norms whole.
  const int64_t split = (C * C + C * C + 3 * C * F);
  CHECK(block_on_rank(4, 2) == 2 * C + split / 2 + 2 * 4 * D * C / 2);  // 2 kv heads a rank
  CHECK(block_on_rank(2, 4) == 2 * C + split / 4 + 2 * 1 * D * C);      // 1 kv head a rank, each held twice
  CHECK(block_on_rank(1, 8) == 2 * C + split / 8 + 2 * 1 * D * C);      // multi-query: every rank the one
  CHECK(block_on_rank(8, 1) == 2 * C + split + 2 * 8 * D * C);
  const dtrain::JobSpec s = spec_with({"model.kind=llama", "model.d_model=64", "model.heads=8", "model.kv_heads=4",
                                       "cluster.procs_per_node=2", "parallel.tp=2"});
  CHECK(rank_numel(embedding_tensors(s.model), tp_view(s)) == V * C / 2);  // no position table
  CHECK(rank_numel(head_tensors(s.model), tp_view(s)) == C + V * C / 2);
  dtrain::JobSpec tied = s;
  tied.model.tie_embeddings = true;
  CHECK(rank_numel(head_tensors(tied.model), tp_view(tied)) == C);
}

TEST_CASE("llama memory: model states per rank; GQA's smaller kv and SwiGLU's width in the activations") {
  // tp 2, zero 0, one stage: params = grads = 4 B and AdamW 8 B per element of the rank's units.
  const std::vector<std::string> base = {"model.kind=llama", "model.d_model=64", "model.heads=8", "model.layers=3",
                                         "model.ffn_hidden=96", "model.seq_len=32", "train.micro_batch=2",
                                         "cluster.procs_per_node=2", "parallel.tp=2", "model.attention=tiled"};
  const int64_t C = 64, V = 256, D = 8, F = 96, L = 3, t = 2;
  const dtrain::JobSpec s = spec_with(with(base, {"model.kv_heads=4"}));
  const RankMemory r = plan_rank(s, 1);
  const int64_t units = V * C / t + L * (2 * C + (2 * C * C + 3 * C * F) / t + 2 * 4 * D * C / t) + C + V * C / t;
  CHECK(r.param_bytes == 4 * units);
  CHECK(r.grad_bytes == 4 * units);
  CHECK(r.optimizer_bytes == 8 * units);
  // k and v are saved at the kv heads' width: 2 x s x b x KV x D / t per block.
  const double sb = 32.0 * 2;
  const RankMemory mha = plan_rank(spec_with(with(base, {"model.kv_heads=8"})), 1);
  CHECK(double(mha.activation_bytes - r.activation_bytes) == 4 * L * 2 * sb * (8 - 4) * D / t);
  // The fused SwiGLU (fp32 on the CPU) saves gate, up and their product:
  // 3 x s x b x F / t per block; ATen's composition (under autocast) also
  // silu(gate): 4 x s x b x F / t.
  const RankMemory wide = plan_rank(spec_with(with(base, {"model.kv_heads=4", "model.ffn_hidden=128"})), 1);
  CHECK(double(wide.activation_bytes - r.activation_bytes) == 4 * L * 3 * sb * (128 - F) / t);
  const auto bf16 = with(base, {"model.kv_heads=4", "train.precision=bf16"});
  const RankMemory narrow_bf16 = plan_rank(spec_with(bf16), 1);
  const RankMemory wide_bf16 = plan_rank(spec_with(with(bf16, {"model.ffn_hidden=128"})), 1);
  CHECK(double(wide_bf16.activation_bytes - narrow_bf16.activation_bytes) == 4 * L * 4 * sb * (128 - F) / t);
}

TEST_CASE("llama flops: 6N + 12 L C s per token; a MoE block counts its top_k experts") {
  // Llama 3 8B at s = 8192: N = the blocks' matrices and the head (not the embedding lookup).
  const dtrain::JobSpec s = spec_with(with(kLlama3_8b, {"model.seq_len=8192"}));
  const double C = 4096, V = 128256, L = 32, F = 14336, KV = 8, D = 128, S = 8192;
  const double n = L * (2 * C * C + 2 * KV * D * C + 3 * C * F) + C * V;
  CHECK(flops_per_token(s.model) == doctest::Approx(6 * n + 12 * L * C * S).epsilon(1e-12));
  // A step: 3 forwards of 2 FLOPs per weight and token plus the scores (4 b s^2 C per block, naive).
  const double tokens = double(s.global_batch()) * S;
  CHECK(flops_per_step(s) ==
        doctest::Approx(3 * (2 * tokens * n + L * 4 * tokens * S * C)).epsilon(1e-12));
  // Mixtral: router E*C and top_k = 2 experts of 3*C*Fe a token, not all 8.
  const dtrain::JobSpec m = spec_with(with(kMixtral, {"model.seq_len=4096"}));
  const double nm = L * (2 * C * C + 2 * KV * D * C + 8 * C + 2 * 3 * C * F) + C * 32000;
  CHECK(flops_per_token(m.model) == doctest::Approx(6 * nm + 12 * L * C * 4096).epsilon(1e-12));
}

TEST_CASE("traffic: dp moves the dense gradients, edp the experts', ep and tp the stage's MoE blocks") {
  // A llama MoE of 6 blocks, every 2nd MoE (blocks 0, 2, 4), over pp 2:
  // stage 0 holds blocks 0-2 (MoE 0 and 2), stage 1 blocks 3-5 (MoE 4).
  const dtrain::JobSpec s =
      spec_with({"model.kind=llama", "model.d_model=64", "model.heads=8", "model.kv_heads=4", "model.layers=6",
                 "model.ffn_hidden=96", "model.moe.experts=4", "model.moe.top_k=2", "model.moe.d_ff=80",
                 "model.moe.every=2", "model.seq_len=32", "train.micro_batch=2", "train.grad_accum=3",
                 "cluster.procs_per_node=8", "parallel.dp=4", "parallel.pp=2", "parallel.ep=2"});
  const TrafficModel t = traffic_model_from_spec(s);
  const uint64_t C = 64, Fe = 80, expert = 3 * C * Fe;
  CHECK(t.expert_params == expert);
  CHECK(double(t.params) == param_count(s.model).dense);
  const AxisSizes sizes{4, 1, 2, 2, 1};  // dp 4, tp 1, pp 2, ep 2
  // edp: the 2 ranks holding the same experts (dp x tp / ep) all-reduce,
  // once a step, the fp32 gradients of the stage's MoE blocks' E / ep = 2
  // experts: AR(X) = 2(n-1)/n X = X for n = 2.
  CHECK(axis_bytes_per_step("edp", 2, 0, sizes, t) == 2 * 2 * expert * 4);
  CHECK(axis_bytes_per_step("edp", 2, 1, sizes, t) == 1 * 2 * expert * 4);
  // ep: per micro-batch and MoE block of the stage, 4 all-to-alls of the
  // rank's top_k rows (half to the other rank) and the (E - E/n) * 8-byte
  // counts; the experts' norm once (AR(8) = 8).
  const uint64_t rows = 2 * 32 * C * 4 * 2 / 2;
  CHECK(axis_bytes_per_step("ep", 2, 0, sizes, t) == 3 * 2 * (4 * rows + 2 * 8) + 8);
  CHECK(axis_bytes_per_step("ep", 2, 1, sizes, t) == 3 * 1 * (4 * rows + 2 * 8) + 8);
  // dp: the dense gradients of a (tp, pp) shard over dp 4: AR(G) = 3/2 G.
  const uint64_t g = t.params / 2 * 4;
  CHECK(axis_bytes_per_step("dp", 4, 0, sizes, t) == g * 2 * 3 / 4);
}
