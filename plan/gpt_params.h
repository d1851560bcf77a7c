// The model's parameter tensors, stated once for each model.kind: their
// shapes, which of them tensor parallelism slices, and the MoE blocks'
// router and experts (gpt: engine/model/gpt.cpp and moe.cpp build exactly
// these; llama: docs' Llama parameter table, llama_params.cpp). Every
// parameter count in plan/ derives from here: the whole model
// (model_size.h), a rank's units (memory_plan.h) and the gradients dp and
// edp reduce (traffic.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace dtrain::plan {

// How tensor parallelism cuts a tensor: not at all (LayerNorms, wpe, the
// row-parallel layers' biases, a MoE router), into tp slices (the column-
// and row-parallel weights, the column-parallel biases), or into tp slices
// only when model.tp_vocab = parallel (wte, head); a llama's kv projection
// splits by kv heads when kv_heads % tp == 0, else (tp % kv_heads == 0)
// each tp rank holds the one kv head its query heads use.
enum class TpSplit { whole, tp, vocab, kv };

struct ParamTensor {
  std::string name;      // the engine's name within its unit ("attn.qkv.weight")
  int64_t rows = 0;      // [rows, cols]; a bias or a LayerNorm vector has cols 1
  int64_t cols = 1;
  TpSplit split = TpSplit::whole;
  double numel() const { return double(rows) * double(cols); }  // doubles: no overflow at any spec
};

// What one rank holds of a split tensor: 1 / tp of it.
struct TpView {
  int64_t tp = 1;
  bool vocab_parallel = false;  // model.tp_vocab = parallel and tp > 1
  int64_t kv_heads = 1;         // the llama's kv heads (TpSplit::kv)
  int64_t kv_divisor() const { return kv_heads % tp == 0 ? tp : kv_heads; }
};
TpView tp_view(const JobSpec& spec);

// The units the engine builds, shards and synchronises one by one.
// By model.kind (a llama: llama_params.cpp).
std::vector<ParamTensor> embedding_tensors(const ModelSpec& m);             // wte (gpt: and wpe)
std::vector<ParamTensor> block_tensors(const ModelSpec& m, int64_t layer);  // a MoE block: router in place of the MLP
std::vector<ParamTensor> expert_tensors(const ModelSpec& m);                // ONE expert of a MoE block
std::vector<ParamTensor> head_tensors(const ModelSpec& m);                  // ln_f, head (untied)

bool is_llama(const ModelSpec& m);
std::vector<ParamTensor> llama_embedding_tensors(const ModelSpec& m);
std::vector<ParamTensor> llama_block_tensors(const ModelSpec& m, int64_t layer);
std::vector<ParamTensor> llama_expert_tensors(const ModelSpec& m);
std::vector<ParamTensor> llama_head_tensors(const ModelSpec& m);

// Elements of the weights a token's forward multiplies with (2 FLOPs each):
// a block's matrices, a MoE block's router and top_k experts; no norms,
// biases or embedding lookups (flops.h).
double block_matmul_numel(const ModelSpec& m, int64_t layer);

// MoE: every model.moe.every-th block (from block 0) when model.moe.experts > 0.
bool is_moe_block(const ModelSpec& m, int64_t layer);
int64_t moe_block_count(const ModelSpec& m);
int64_t expert_hidden(const ModelSpec& m);  // model.moe.d_ff, or 4 d_model

// Elements of `tensors` on one tp rank (split tensors: numel / tp each).
int64_t rank_numel(const std::vector<ParamTensor>& tensors, const TpView& view);

struct ParamCount {
  double dense = 0;    // everything but the experts (router included)
  double experts = 0;  // every expert of every MoE block
  double total() const { return dense + experts; }
};
// The whole model, unsplit, of either kind.
ParamCount param_count(const ModelSpec& m);
// Elements of one expert (0 for a dense model).
double expert_numel(const ModelSpec& m);

}  // namespace dtrain::plan
