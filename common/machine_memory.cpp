// machine_memory_bytes and gigabytes (machine_memory.h): sysconf's physical
// pages, lowered by a cgroup v2 memory.max when one is set.
#include "common/machine_memory.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace dtrain {

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
