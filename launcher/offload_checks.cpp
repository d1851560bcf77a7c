// check_offload (offload_checks.h). The free-space figure is what the
// planner puts in nvme files (plan/model_size.h): 8 bytes of AdamW state per
// local parameter, times the ranks of this machine.
#include "launcher/offload_checks.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "common/error.h"
#include "common/machine_memory.h"
#include "common/offload_files.h"
#include "plan/model_size.h"

namespace dtrain::launcher {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void refuse(const std::string& text, const std::string& fix) { throw Error(ErrorCode::config, text, fix); }

// True when `inner` is `outer` or lies below it (both made absolute and
// normalised, symlinks resolved where they exist).
bool lies_in(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(fs::absolute(inner), ec), b = fs::weakly_canonical(fs::absolute(outer), ec);
  auto ai = a.begin();
  for (auto bi = b.begin(); bi != b.end(); ++bi, ++ai) {
    if (bi->empty()) continue;  // a trailing slash
    if (ai == a.end() || *ai != *bi) return false;
  }
  return true;
}

void check_path(const JobSpec& spec) {
  const std::string& path = spec.train.offload.path;
  const std::string field = "train.offload.path = " + path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    refuse(field + " does not exist", "create it (mkdir -p " + path + ") or point train.offload.path at a directory");
  if (!fs::is_directory(st))
    refuse(field + " is not a directory", "point train.offload.path at a directory (one file per rank goes there)");
  if (!spec.checkpoint.dir.empty() && lies_in(path, spec.checkpoint.dir))
    refuse(field + " lies in checkpoint.dir = " + spec.checkpoint.dir +
               ": offload files are scratch, a checkpoint directory holds only checkpoints",
           "give train.offload.path a directory outside checkpoint.dir");
  struct statvfs vfs {};
  const bool have_vfs = ::statvfs(path.c_str(), &vfs) == 0;
  if (::access(path.c_str(), W_OK | X_OK) != 0 || (have_vfs && (vfs.f_flag & ST_RDONLY)))
    refuse(field + " is not writable (read-only file system or no permission)",
           "point train.offload.path at a writable directory on a local disk");
  const double need = plan::model_size(spec).nvme_rank_bytes * std::max(1, spec.cluster.procs_per_node);
  const double free_bytes = double(vfs.f_bavail) * double(vfs.f_frsize);
  if (have_vfs && need > free_bytes)
    refuse(field + " has " + gigabytes(free_bytes) + " free; the offload files of this machine's " +
               std::to_string(spec.cluster.procs_per_node) + " rank(s) need " + gigabytes(need),
           "free space there, point train.offload.path at a larger disk, or shard AdamW's state (parallel.zero)");
}

}  // namespace

void check_offload(const JobSpec& spec, int gpus) {
  const OffloadSpec& o = spec.train.offload;
  for (const auto& [field, target] : {std::pair{"train.offload.optimizer", o.optimizer}, {"train.offload.params", o.params}})
    if (target == OffloadTarget::host && gpus == 0 && !host_offload_on_cpu())
      refuse(std::string(field) + " = host on a machine without a GPU: host memory is where the state is already",
             "use " + std::string(field) + ": nvme (files under train.offload.path), which runs everywhere");
  if (o.optimizer == OffloadTarget::nvme || o.params == OffloadTarget::nvme) check_path(spec);
}

}  // namespace dtrain::launcher
