// clip_grad_norm (grad_norm.h). The squared sum travels as a [1] fp64 tensor
// and is summed over the groups one after another in the caller's order:
// fp64 addition is not associative, so every sync keeps one fixed order and
// its parity runs see the same figure on every rank.
#include "engine/parallel/grad_norm.h"

#include <ATen/ops/full.h>

#include <algorithm>
#include <cmath>

#include "engine/comm/no_sync_group.h"
#include "engine/optim/adamw.h"

namespace dtrain::engine::parallel {

double clip_grad_norm(const std::vector<at::Tensor>& grads, const std::vector<bool>& counted,
                      const std::vector<comm::Group*>& over, double max_norm, double global_sq,
                      double* scale) {
  std::vector<at::Tensor> mine;  // this rank's share of the global gradient
  for (size_t i = 0; i < grads.size(); ++i)
    if (counted.empty() || counted[i]) mine.push_back(grads[i]);
  double sq = optim::local_grad_sq_norm(mine);
  at::Tensor t;  // [1] fp64, created only when some group has another rank
  for (comm::Group* g : over) {
    comm::Group& group = comm::reducing_group(*g);
    if (group.size() == 1) continue;
    if (!t.defined())
      t = at::full({1}, sq, at::TensorOptions().dtype(at::kDouble).device(group.device()));
    else if (t.device() != group.device())
      t = t.to(group.device());
    group.all_reduce(t);
  }
  if (t.defined()) sq = t.item<double>();
  const double norm = std::sqrt(global_sq + sq);
  const double factor = max_norm > 0 ? std::min(1.0, max_norm / (norm + kClipEps)) : 1.0;
  if (scale)
    *scale = factor;
  else
    optim::scale_grads(grads, factor);
  return norm;
}

}  // namespace dtrain::engine::parallel
