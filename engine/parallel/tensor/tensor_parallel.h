// Tensor parallelism (Megatron-LM) for the GPT: each TP rank keeps its slice
// of every split parameter (attention by heads: qkv column-parallel, the
// output projection row-parallel; the MLP's fc column-parallel and proj
// row-parallel; the token embedding and the head vocab-parallel) and the
// model combines them over the TP group (model/tp_ops.h: 2 all-reduces
// forward and 2 backward per block). LayerNorms, wpe and row-parallel
// biases stay whole on every TP rank, with identical gradients. A llama's
// q splits by query heads, its [k; v] by kv heads (or, when tp is a multiple
// of kv_heads, stays whole with its partial gradients summed over tp), its
// [gate; up] by hidden rows, its RMSNorm weights whole.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/model/gpt.h"
#include "engine/parallel/param_layout.h"

namespace dtrain::engine::parallel {

// Replaces the parameters of `model` (full and identical on every rank, or
// built cut by tp_slicer) by this rank's slices, installs the TP group in the model and returns each
// parameter's layout, in the order of named_params. tp.size() must divide
// heads, d_model and vocab (the spec checks; this throws otherwise).
// sequence_parallel: LayerNorms, dropout and the residual stream hold
// T / tp positions per rank; their replicated parameters (LayerNorms,
// row-parallel biases, wpe) get sum_grad_over_tp. vocab_parallel false
// keeps wte and head whole (model.tp_vocab replicated). fault_no_row_reduce:
// fault.kind no_tp_reduce (TpGroup::fault_no_row_reduce).
// Where parameter `name` of global `shape` sits on tp rank r of n: its
// split (whole and tp_owner on rank 0 only when replicated).
ParamLayout tp_layout(const std::string& name, const std::vector<int64_t>& shape, int kv_heads, int r, int n,
                      bool sequence_parallel, bool vocab_parallel);
// The local slice of a whole parameter under layout `l` (sharded).
at::Tensor tp_slice(const at::Tensor& whole, const ParamLayout& l);
// BuildScope::slice for tp rank r of n: the model is built already cut.
std::function<at::Tensor(const std::string&, const at::Tensor&)> tp_slicer(int kv_heads, int r, int n,
                                                                            bool vocab_parallel);

std::vector<ParamLayout> apply_tensor_parallel(model::GptImpl& model,
                                               const std::vector<std::pair<std::string, at::Tensor>>& named_params,
                                               comm::Group& tp, bool sequence_parallel,
                                               bool vocab_parallel = true, bool fault_no_row_reduce = false);

}  // namespace dtrain::engine::parallel
