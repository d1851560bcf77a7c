// apply_expert_parallel (expert_parallel.h): which tensors are per expert,
// the slicing along the expert dim, and the model's view of the ep group.
#include "engine/parallel/expert/expert_parallel.h"

#include <c10/core/GradMode.h>

#include "common/error.h"

namespace dtrain::engine::parallel {

bool is_expert_param(const std::string& name) {
  return name.find(".moe.fc.") != std::string::npos || name.find(".moe.proj.") != std::string::npos;
}

void apply_expert_parallel(model::GptImpl& model, const std::vector<std::pair<std::string, at::Tensor>>& named_params,
                           std::vector<ParamLayout>& layouts, comm::Group& ep) {
  const int n = ep.size(), r = ep.rank();
  const int64_t experts = model.config().moe.experts;
  if (experts % n != 0)
    throw Error(ErrorCode::config, "model.moe.experts = " + std::to_string(experts) +
                                       " is not divisible by parallel.ep = " + std::to_string(n),
                "use a multiple of ep experts");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < named_params.size(); ++i) {
    const auto& [name, p] = named_params[i];
    // Under sequence parallelism the router sees the gathered tokens of the
    // whole micro-batch on every TP rank: its gradient is whole, not a
    // partial sum like the other replicated parameters' in the SP region.
    if (name.find(".moe.router.") != std::string::npos) layouts[i].sum_grad_over_tp = false;
    if (!is_expert_param(name)) continue;
    ParamLayout& l = layouts[i];
    // Under TP the experts are not split over tp: each TP rank runs its
    // share of the tokens through them, so their gradients are summed over
    // edp (which then holds the tp ranks too) and edp rank 0 writes them.
    l.tp_owner = true;
    l.sum_grad_over_tp = false;
    if (n == 1) continue;
    const int64_t mine = experts / n;
    l.dim = 0;
    l.segments = {{0, mine, r * mine}};
    l.global_shape[0] = experts;
    if (p.size(0) == mine) continue;  // built as this rank's experts (gpt.h's BuildScope)
    at::Tensor param = p;
    param.set_data(p.narrow(0, r * mine, mine).contiguous());  // [E / ep, ...]
  }
  comm::Group* group = &ep;
  model::EpGroup g;
  g.rank = r;
  g.size = n;
  g.all_to_all = [group](const at::Tensor& in, at::Tensor& o, const std::vector<int64_t>& out_splits,
                         const std::vector<int64_t>& in_splits) { group->all_to_all(in, o, out_splits, in_splits); };
  model.set_expert_parallel(std::move(g));
}

DenseAndExperts split_experts(const std::vector<std::pair<std::string, at::Tensor>>& named_params,
                              const std::vector<ParamLayout>& layouts) {
  DenseAndExperts out;
  for (size_t i = 0; i < named_params.size(); ++i) {
    if (is_expert_param(named_params[i].first)) {
      out.experts.named.push_back(named_params[i]);
      out.experts.layouts.push_back(layouts[i]);
    } else {
      out.dense.push_back(named_params[i]);
      out.dense_layouts.push_back(layouts[i]);
    }
  }
  return out;
}

}  // namespace dtrain::engine::parallel
