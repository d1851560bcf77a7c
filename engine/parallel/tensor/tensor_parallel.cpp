// apply_tensor_parallel (tensor_parallel.h): which parameter splits how, by
// its name, and the slicing itself.
#include "engine/parallel/tensor/tensor_parallel.h"

#include <ATen/ops/cat.h>
#include <c10/core/GradMode.h>

#include "common/error.h"
#include "common/log.h"

namespace dtrain::engine::parallel {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// This rank's part along `dim` of a global parameter of `shape`: `parts`
// equal blocks of the dim (1 for most, 3 for qkv = [q; k; v]), of each the
// rank's 1/n.
ParamLayout split(const std::vector<int64_t>& shape, int dim, int parts, int rank, int n) {
  ParamLayout l;
  l.global_shape = shape;
  l.dim = dim;
  const int64_t block = shape[size_t(dim)] / parts, mine = block / n;
  int64_t local = 0;
  for (int j = 0; j < parts; ++j) {
    l.segments.push_back({local, local + mine, j * block + rank * mine});
    local += mine;
  }
  return l;
}

}  // namespace

ParamLayout tp_layout(const std::string& name, const std::vector<int64_t>& shape, int kv_heads, int r, int n,
                      bool sequence_parallel, bool vocab_parallel) {
  ParamLayout l;
  l.global_shape = shape;
  const bool kv_replicated = ends_with(name, "attn.kv.weight") && kv_heads % n != 0;
  if (ends_with(name, "attn.qkv.weight") || ends_with(name, "attn.qkv.bias"))
    l = split(shape, 0, 3, r, n);  // column-parallel by heads, q, k and v alike
  else if ((ends_with(name, "attn.kv.weight") && !kv_replicated) || ends_with(name, "mlp.gate_up.weight"))
    l = split(shape, 0, 2, r, n);  // column-parallel: [k; v] by kv heads, [gate; up] by hidden rows
  else if (ends_with(name, "attn.q.weight"))
    l = split(shape, 0, 1, r, n);  // column-parallel by query heads
  else if (ends_with(name, "mlp.fc.weight") || ends_with(name, "mlp.fc.bias") ||
           (vocab_parallel && (name == "wte.weight" || name == "head.weight")))
    l = split(shape, 0, 1, r, n);  // column-parallel rows / vocab-parallel rows
  else if (ends_with(name, "attn.proj.weight") || ends_with(name, "mlp.proj.weight"))
    l = split(shape, 1, 1, r, n);  // row-parallel: input columns
  if (!l.sharded()) {
    l.tp_owner = r == 0;  // replicated over TP: rank 0 counts and writes it
    // Every replicated one lives in the SP region; a replicated kv's
    // gradient covers this rank's query heads only.
    l.sum_grad_over_tp = sequence_parallel || kv_replicated;
  }
  return l;
}

at::Tensor tp_slice(const at::Tensor& whole, const ParamLayout& l) {
  std::vector<at::Tensor> pieces;
  for (const auto& s : l.segments) pieces.push_back(whole.narrow(l.dim, s.global_begin, s.local_end - s.local_begin));
  return at::cat(pieces, l.dim).contiguous();  // this rank's slice, [local shape]
}

std::function<at::Tensor(const std::string&, const at::Tensor&)> tp_slicer(int kv_heads, int r, int n,
                                                                            bool vocab_parallel) {
  return [=](const std::string& name, const at::Tensor& whole) {
    const ParamLayout l = tp_layout(name, whole.sizes().vec(), kv_heads, r, n, false, vocab_parallel);
    return l.sharded() ? tp_slice(whole, l) : whole;
  };
}

std::vector<ParamLayout> apply_tensor_parallel(model::GptImpl& model,
                                               const std::vector<std::pair<std::string, at::Tensor>>& named_params,
                                               comm::Group& tp, bool sequence_parallel,
                                               bool vocab_parallel, bool fault_no_row_reduce) {
  const int n = tp.size(), r = tp.rank();
  const auto& cfg = model.config();
  for (auto [what, v] : {std::pair{"model.heads", cfg.heads}, {"model.d_model", cfg.d_model},
                         {"model.vocab", vocab_parallel ? cfg.vocab : n}, {"model.ffn_hidden", cfg.llama() ? cfg.ffn() : n}})
    if (v % n != 0)
      throw Error(ErrorCode::config, std::string(what) + " = " + std::to_string(v) + " is not divisible by parallel.tp = " +
                                         std::to_string(n), "choose a tp that divides heads, d_model, vocab (and a llama's ffn_hidden)");
  // llama's kv heads: split over tp (k rows and v rows alike), or, when tp
  // is a multiple of them, whole on every rank (each rank reads the one kv
  // head its query heads use; its gradient is partial: summed over tp).
  const int kv = cfg.kv();
  if (cfg.llama() && kv % n != 0 && n % kv != 0)
    throw Error(ErrorCode::config, "model.kv_heads = " + std::to_string(kv) + " with parallel.tp = " +
                                       std::to_string(n) + ": neither divides the other",
                "choose a tp that divides or is a multiple of kv_heads");
  std::vector<ParamLayout> layouts;
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : named_params) {
    // A parameter the model was built cut (gpt.h's BuildScope, with
    // tp_slicer's cut) is already this rank's slice.
    ParamLayout l = tp_layout(name, model.whole_shape(name, p), kv, r, n, sequence_parallel, vocab_parallel);
    if (l.sharded() && p.sizes().vec() == l.global_shape) {
      at::Tensor param = p;
      param.set_data(tp_slice(p, l));
    }
    layouts.push_back(std::move(l));
  }
  comm::Group* group = &tp;
  model::TpGroup g;
  g.rank = r;
  g.size = n;
  g.sum = [group](at::Tensor& t) { group->all_reduce(t); };
  g.max = [group](at::Tensor& t) { group->all_reduce(t, /*async=*/false, comm::ReduceOp::max); };
  g.sequence_parallel = sequence_parallel;
  g.vocab_parallel = vocab_parallel;
  g.fault_no_row_reduce = fault_no_row_reduce;
  if (fault_no_row_reduce && r == 0)
    DTRAIN_WARN("fault.kind = no_tp_reduce: the row-parallel layers skip their all-reduce over tp "
                "(a wrong layout on purpose)");
  g.all_gather = [group](const at::Tensor& in, at::Tensor& out) { group->all_gather(in, out); };
  g.reduce_scatter = [group](const at::Tensor& in, at::Tensor& out) { group->reduce_scatter(in, out); };
  model.set_tensor_parallel(std::move(g));
  return layouts;
}

}  // namespace dtrain::engine::parallel
