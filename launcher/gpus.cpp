// gpus.h: counting GPUs from the driver's device nodes.
#include "launcher/gpus.h"

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>

#include "common/error.h"
#include "common/job_spec.h"

namespace dtrain::launcher {

namespace fs = std::filesystem;

namespace {

int count_entries(const fs::path& dir, const std::regex& name) {
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (std::regex_match(it->path().filename().string(), name)) ++n;
  return n;
}

}  // namespace

int visible_gpus() {
  int n = count_entries("/dev", std::regex("nvidia[0-9]+"));
  if (n == 0) n = count_entries("/proc/driver/nvidia/gpus", std::regex(".+"));
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::stringstream ss(cvd);
    std::string item;
    int listed = 0;
    while (std::getline(ss, item, ','))
      if (!item.empty()) ++listed;
    n = std::min(n, listed);
  }
  return n;
}

void check_devices(const JobSpec& spec) {
  if (spec.cluster.device != DeviceKind::cuda) return;
  const int gpus = visible_gpus();
  if (gpus == 0)
    throw Error(ErrorCode::config,
                spec.source + ": cluster.device = cuda, but this machine shows no NVIDIA GPU "
                              "(no /dev/nvidia<N>, or CUDA_VISIBLE_DEVICES hides them all)",
                "use cluster.device cpu (--set cluster.device=cpu), or launch on a machine with GPUs");
  if (spec.cluster.procs_per_node > gpus)
    throw Error(ErrorCode::config,
                spec.source + ": cluster.procs_per_node = " +
                    std::to_string(spec.cluster.procs_per_node) + " workers on cuda, but this "
                    "machine shows " + std::to_string(gpus) + " GPU(s)",
                "one worker per GPU: set cluster.procs_per_node to at most " + std::to_string(gpus));
}

}  // namespace dtrain::launcher
