// ParamLayout helpers (param_layout.h).
#include "engine/parallel/param_layout.h"

#include <ATen/ops/cat.h>

#include <algorithm>

namespace dtrain::engine::parallel {

ParamLayout ParamLayout::whole(const at::Tensor& t) {
  ParamLayout l;
  l.global_shape = t.sizes().vec();
  return l;
}

void sum_over_tp(const std::vector<at::Tensor>& grads, comm::Group& tp) {
  if (grads.empty() || tp.size() == 1) return;
  std::vector<at::Tensor> flat;
  for (const auto& g : grads) flat.push_back(g.reshape({-1}));
  at::Tensor all = at::cat(flat);  // [sum numel]
  tp.all_reduce(all);
  int64_t off = 0;
  for (const auto& g : grads) {
    g.view({-1}).copy_(all.narrow(0, off, g.numel()));
    off += g.numel();
  }
}

std::vector<StateEntry> global_entries(const std::string& name, const ParamLayout& layout,
                                       const std::vector<std::pair<int64_t, int64_t>>& local,
                                       const at::Tensor& tensor, bool keyed) {
  auto key_of = [&](const std::vector<std::pair<int64_t, int64_t>>& slice) {
    if (!keyed) return std::string();
    int64_t offset = 0;  // flat index of the slice's first element in the global tensor
    for (size_t d = 0; d < slice.size(); ++d) offset = offset * layout.global_shape[d] + slice[d].first;
    return name + "#" + std::to_string(offset);
  };
  std::vector<StateEntry> out;
  if (!layout.sharded()) {
    out.push_back({name, layout.global_shape, local, tensor, key_of(local)});
    return out;
  }
  const size_t d = size_t(layout.dim);
  for (const auto& seg : layout.segments) {
    const int64_t b = std::max(local[d].first, seg.local_begin);
    const int64_t e = std::min(local[d].second, seg.local_end);
    if (b >= e) continue;
    auto slice = local;
    slice[d] = {seg.global_begin + (b - seg.local_begin), seg.global_begin + (e - seg.local_begin)};
    at::Tensor part = tensor.narrow(int64_t(d), b - local[d].first, e - b);
    out.push_back({name, layout.global_shape, slice, part, key_of(slice)});
  }
  return out;
}

}  // namespace dtrain::engine::parallel
