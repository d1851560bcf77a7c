// The job spec's train.offload rules that need no file system: nvme needs a
// path, params offload needs ZeRO-3 (only its parameters are shards with a
// life between uses), host needs cluster.device cuda (the optimizer's also
// params' runs on a CPU under a test override: common/offload_files.h). The path
// itself (a writable directory with room, outside checkpoint.dir) is
// checked at launch (launcher/offload_checks.h).
#include <string>

#include "common/offload_files.h"
#include "common/spec_detail.h"

namespace dtrain::detail {

void validate_offload(const JobSpec& s, const SpecOrigin& origin, Problems& problems) {
  const OffloadSpec& o = s.train.offload;
  auto error = [&](const std::string& path, const std::string& text) { problems.error(origin.where(path), text); };
  for (const char* path : {"train.offload.optimizer", "train.offload.params"}) {
    if (origin.any_bad({path, "cluster.device"})) continue;
    const OffloadTarget t = std::string(path) == "train.offload.optimizer" ? o.optimizer : o.params;
    if (t == OffloadTarget::nvme && o.path.empty() && !origin.any_bad({"train.offload.path"}))
      error("train.offload.path", std::string(path) + " = nvme needs train.offload.path: the directory that "
                                  "holds one file per rank; e.g. path: /scratch/dtrain-offload");
    const bool cpu_override = host_offload_on_cpu();
    if (t == OffloadTarget::host && s.cluster.device == DeviceKind::cpu && !cpu_override)
      error(path, std::string(path) + " = host with cluster.device = cpu: the state is in host memory "
                  "already; use nvme (files under train.offload.path) to take it out of memory");
  }
  if (o.params != OffloadTarget::none && s.parallel.zero != 3 && !origin.any_bad({"train.offload.params", "parallel.zero"}))
    error("train.offload.params", "train.offload.params = " + to_string(o.params) + " with parallel.zero = " +
                                      std::to_string(s.parallel.zero) + ": only ZeRO-3 keeps parameters as shards "
                                      "between uses; set parallel.zero: 3 or train.offload.params: none");
  if (!origin.any_bad({"train.offload.bucket_mb"}) && !(o.bucket_mb > 0))
    error("train.offload.bucket_mb", "train.offload.bucket_mb = " + format_double(o.bucket_mb) +
                                         ": must be > 0 (megabytes of AdamW state per I/O bucket); e.g. 64");
  const FaultKind f = s.fault.kind;
  const bool offload_fault =
      f == FaultKind::offload_no_writeback || f == FaultKind::offload_truncate || f == FaultKind::offload_delete;
  const bool nvme = o.optimizer == OffloadTarget::nvme || o.params == OffloadTarget::nvme;
  // offload_no_writeback also acts on host: the master never reaches the
  // parameters, or the updated shards never reach their host buffer.
  const bool host_copy = f == FaultKind::offload_no_writeback &&
                         (o.optimizer == OffloadTarget::host || o.params == OffloadTarget::host);
  if (offload_fault && !nvme && !host_copy && !origin.any_bad({"fault.kind", "train.offload.optimizer", "train.offload.params"}))
    error("fault.kind", "fault.kind = " + to_string(f) + " acts on train.offload's files, but "
                        "train.offload.optimizer = " + to_string(o.optimizer) + " and train.offload.params = " +
                        to_string(o.params) + "; set train.offload.optimizer (or .params): nvme");
  if ((f == FaultKind::offload_truncate || f == FaultKind::offload_delete) && s.fault.step < 1 &&
      !origin.any_bad({"fault.kind", "fault.step"}))
    error("fault.step", "fault.step = " + std::to_string(s.fault.step) + ": fault.kind = " + to_string(f) +
                            " strikes after step fault.step, and steps count from 1; use fault.step >= 1");
  if (!o.active() && !o.path.empty())
    problems.warn("train.offload.path = " + o.path + " is ignored: train.offload.optimizer and .params are none");
}

}  // namespace dtrain::detail
