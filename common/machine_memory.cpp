// usable_cpus, machine_memory_bytes and gigabytes (machine_memory.h):
// sched_getaffinity's mask; sysconf's physical pages, lowered by a cgroup v2
// memory.max when one is set.
#include "common/machine_memory.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include <cstdio>
#include <fstream>

namespace dtrain {

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return int(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
}

uint64_t machine_memory_bytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  std::ifstream cg("/sys/fs/cgroup/memory.max");
  unsigned long long limit = 0;
  if (cg >> limit && limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;  // "max" reads as 0
  return bytes;
}

std::string gigabytes(double bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  return buf;
}

}  // namespace dtrain
