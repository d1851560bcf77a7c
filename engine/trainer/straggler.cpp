// straggler_stats (straggler.h): one all-gather of a double per rank.
#include "engine/trainer/straggler.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include <algorithm>
#include <vector>

namespace dtrain::engine::trainer {

StragglerStats straggler_stats(comm::Group& world, double compute_s) {
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(world.device());
  at::Tensor mine = at::full({1}, compute_s, opts);       // [1]
  at::Tensor all = at::empty({world.size()}, opts);       // [world]
  world.all_gather(mine, all);
  at::Tensor host = all.cpu();
  std::vector<double> v(host.data_ptr<double>(), host.data_ptr<double>() + world.size());
  StragglerStats s;
  s.slowest_rank = int(std::max_element(v.begin(), v.end()) - v.begin());
  s.slowest_s = v[size_t(s.slowest_rank)];
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.median_s = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  s.ratio = s.median_s > 0 ? s.slowest_s / s.median_s : 1.0;
  // slowest_rank is an index into the group; the world group's is the global rank.
  s.slowest_rank = world.global_ranks()[size_t(s.slowest_rank)];
  return s;
}

}  // namespace dtrain::engine::trainer
