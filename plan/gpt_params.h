// The GPT's parameter tensors, stated once: their shapes, which of them
// tensor parallelism slices, and the MoE blocks' router and experts
// (engine/model/gpt.cpp and moe.cpp build exactly these). Every parameter
// count in plan/ derives from here: the whole model (model_size.h), a
// rank's units (memory_plan.h) and the gradients dp reduces (traffic.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace dtrain::plan {

// How tensor parallelism cuts a tensor: not at all (LayerNorms, wpe, the
// row-parallel layers' biases, a MoE router), into tp slices (the column-
// and row-parallel weights, the column-parallel biases), or into tp slices
// only when model.tp_vocab = parallel (wte, head).
enum class TpSplit { whole, tp, vocab };

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
};
TpView tp_view(const JobSpec& spec);

// The units the engine builds, shards and synchronises one by one.
std::vector<ParamTensor> embedding_tensors(const ModelSpec& m);             // wte, wpe
std::vector<ParamTensor> block_tensors(const ModelSpec& m, int64_t layer);  // a MoE block: router in place of the MLP
std::vector<ParamTensor> expert_tensors(const ModelSpec& m);                // ONE expert of a MoE block
std::vector<ParamTensor> head_tensors(const ModelSpec& m);                  // ln_f, head (untied)

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
// The whole model, unsplit.
ParamCount gpt_param_count(const ModelSpec& m);

}  // namespace dtrain::plan
