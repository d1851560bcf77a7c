// What this machine offers the job's ranks: the CPUs this process may run
// on, its physical memory (or the cgroup's limit), and the one way sizes in
// gigabytes are printed next to it.
// Host facts only: what a model needs is plan/'s business.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain {

// Logical CPUs this process may run on (its affinity mask; all online CPUs
// where that cannot be read), at least 1.
int usable_cpus();

// Physical memory of this machine (or the cgroup's limit when lower); 0 = unknown.
uint64_t machine_memory_bytes();

// "1.50 GB"
std::string gigabytes(double bytes);

}  // namespace dtrain
