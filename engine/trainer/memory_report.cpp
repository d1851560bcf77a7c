// write_memory_report (memory_report.h): one all-gather of 6 int64 per rank
// over the control group, then a tab-separated table written atomically.
#include "engine/trainer/memory_report.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include <fmt/format.h>

#include "common/log.h"
#include "common/safe_output.h"

namespace dtrain::engine::trainer {

void write_memory_report(TrainSession& s, int64_t run_peak) {
  const MemoryStats m = s.memory();
  constexpr int kFields = 6;
  const std::vector<int64_t> mine = {int64_t(s.info.rank), m.params, m.grads, m.optimizer, run_peak, m.rss};
  at::Tensor local = at::tensor(mine, at::kLong);  // [kFields]
  comm::Group& control = s.comm->control();
  at::Tensor all = at::empty({int64_t(control.size()) * kFields}, at::kLong);  // [world * kFields]
  control.all_gather(local, all);
  const std::string dir = s.info.run_dir.empty() ? s.spec.log.dir : s.info.run_dir;
  if (!s.is_log_rank() || dir.empty()) return;
  std::string text = "rank\tparam_bytes\tgrad_bytes\toptimizer_bytes\tpeak_bytes\trss_bytes\n";
  const int64_t* v = all.data_ptr<int64_t>();
  for (int r = 0; r < control.size(); ++r, v += kFields)
    text += fmt::format("{}\t{}\t{}\t{}\t{}\t{}\n", v[0], v[1], v[2], v[3], v[4], v[5]);
  // The run directory is dtrain's own: a report of an earlier run is replaced.
  SafeOutput out(dir + "/memory.tsv", "memory.tsv", Clobber::replace);
  out.write(text);
  out.commit();
}

}  // namespace dtrain::engine::trainer
