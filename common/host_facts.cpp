// gather_host_facts (machine_facts.h): this machine's cores (the affinity
// mask, as a worker would see it), NUMA nodes (/sys), CPU vendor, model and
// flags (/proc/cpuinfo), memory and network interfaces (getifaddrs). No
// LibTorch; the engine's facts come from dtrain-worker.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/machine_facts.h"
#include "common/machine_memory.h"

namespace dtrain {
namespace {

std::string cpuinfo_field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string v = line.substr(colon + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return v;
  }
  return "";
}

int numa_nodes() {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) == 0 && name.size() > 4 &&
        name.find_first_not_of("0123456789", 4) == std::string::npos)
      ++n;
  }
  return n > 0 ? n : 1;  // no /sys/devices/system/node: one node
}

std::vector<NetInterface> interfaces() {
  std::vector<NetInterface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6)) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    const void* src = a->ifa_addr->sa_family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    if (!::inet_ntop(a->ifa_addr->sa_family, src, buf, sizeof buf)) continue;
    out.push_back({a->ifa_name, buf, (a->ifa_flags & IFF_UP) != 0, (a->ifa_flags & IFF_LOOPBACK) != 0});
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace

CpuFlags cpu_flags_from_cpuinfo(const std::string& text) {
  std::istringstream flags(" " + cpuinfo_field(text, "flags") + " ");
  CpuFlags f;
  std::string w;
  while (flags >> w) {
    if (w == "avx") f.avx = true;
    else if (w == "avx2") f.avx2 = true;
    else if (w == "fma") f.fma = true;
    else if (w == "avx512f") f.avx512f = true;
    else if (w == "avx512_bf16") f.avx512_bf16 = true;
    else if (w == "amx_tile") f.amx_tile = true;
    else if (w == "amx_bf16") f.amx_bf16 = true;
  }
  return f;
}

HostFacts gather_host_facts() {
  HostFacts h;
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name) == 0) h.hostname = name;
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  h.cpu_vendor = cpuinfo_field(text.str(), "vendor_id");
  h.cpu_model = cpuinfo_field(text.str(), "model name");
  h.flags = cpu_flags_from_cpuinfo(text.str());
  h.cores = usable_cpus();
  h.numa_nodes = numa_nodes();
  h.memory_bytes = machine_memory_bytes();
  h.interfaces = interfaces();
  return h;
}

}  // namespace dtrain
