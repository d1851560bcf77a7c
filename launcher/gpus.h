// What the launcher can tell about this machine's NVIDIA GPUs without CUDA or
// LibTorch (it must start in milliseconds): device nodes, CUDA_VISIBLE_DEVICES.
// Used to refuse cluster.device cuda before any worker starts.
#pragma once

#include <string>

namespace dtrain {
struct JobSpec;
}

namespace dtrain::launcher {

// /dev/nvidia<N> nodes (or /proc/driver/nvidia/gpus entries), limited by
// CUDA_VISIBLE_DEVICES when it is set.
int visible_gpus();

// Throws dtrain::Error(config) naming cluster.device / cluster.procs_per_node
// when the spec asks for more GPUs than this machine shows.
void check_devices(const JobSpec& spec);

}  // namespace dtrain::launcher
