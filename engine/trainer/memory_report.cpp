// write_memory_report (memory_report.h): two all-gathers of a few int64 per
// rank over the control group, then two tab-separated tables written atomically.
#include "engine/trainer/memory_report.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include <fmt/format.h>

#include "common/log.h"
#include "common/safe_output.h"

namespace dtrain::engine::trainer {

namespace {

// Every rank's `mine` (the same count on each), gathered over the control group.
std::vector<int64_t> gather_rows(comm::Group& control, const std::vector<int64_t>& mine) {
  at::Tensor local = at::tensor(mine, at::kLong);                                        // [fields]
  at::Tensor all = at::empty({int64_t(control.size()) * int64_t(mine.size())}, at::kLong);  // [world * fields]
  control.all_gather(local, all);
  return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
}

// The run directory is dtrain's own: a report of an earlier run is replaced.
void write_table(const std::string& path, const std::string& what, const std::string& header,
                 const std::vector<int64_t>& rows, size_t fields) {
  std::string text = header;
  for (size_t i = 0; i < rows.size(); i += fields) {
    for (size_t f = 0; f < fields; ++f) text += fmt::format("{}{}", f ? "\t" : "", rows[i + f]);
    text += "\n";
  }
  SafeOutput out(path, what, Clobber::replace);
  out.write(text);
  out.commit();
}

}  // namespace

void write_memory_report(TrainSession& s, int64_t run_peak, const StepBytes& last_step) {
  const MemoryStats m = s.memory();
  comm::Group& control = s.comm->control();
  const int64_t rank = s.info.rank;
  const auto memory = gather_rows(control, {rank, m.params, m.grads, m.optimizer, run_peak, m.rss});
  // A cp column only for a job with context parallelism.
  const bool cp = s.info.mesh.cp() > 1;
  std::vector<int64_t> row = {rank, last_step.dp, last_step.tp, last_step.ep};
  if (cp) row.push_back(last_step.cp);
  const auto bytes = gather_rows(control, row);
  const std::string dir = s.info.run_dir.empty() ? s.spec.log.dir : s.info.run_dir;
  if (!s.is_log_rank() || dir.empty()) return;
  write_table(dir + "/memory.tsv", "memory.tsv",
              "rank\tparam_bytes\tgrad_bytes\toptimizer_bytes\tpeak_bytes\trss_bytes\n", memory, 6);
  write_table(dir + "/comm.tsv", "comm.tsv",
              cp ? "rank\tdp_bytes\ttp_bytes\tep_bytes\tcp_bytes\n" : "rank\tdp_bytes\ttp_bytes\tep_bytes\n", bytes,
              cp ? 5 : 4);
}

}  // namespace dtrain::engine::trainer
