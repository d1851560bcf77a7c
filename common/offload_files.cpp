// offload_file, remove_offload_files and host_offload_on_cpu (offload_files.h).
#include "common/offload_files.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace dtrain {
namespace {

std::string prefix(const std::string& job) {
  std::string safe = job;
  for (char& c : safe)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return "dtrain-offload-" + safe + "-rank";
}

}  // namespace

std::string offload_file(const std::string& dir, const std::string& job, int rank) {
  return (std::filesystem::path(dir) / (prefix(job) + std::to_string(rank) + ".bin")).string();
}

std::string offload_params_file(const std::string& dir, const std::string& job, int rank) {
  return (std::filesystem::path(dir) / (prefix(job) + std::to_string(rank) + ".params.bin")).string();
}

int remove_offload_files(const std::string& dir, const std::string& job, int min_rank) {
  const std::string p = prefix(job);
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t tail = name.size() > 11 && name.substr(name.size() - 11) == ".params.bin" ? 11 : 4;
    if (name.size() <= p.size() + tail || name.rfind(p, 0) != 0 || name.substr(name.size() - 4) != ".bin") continue;
    const std::string digits = name.substr(p.size(), name.size() - p.size() - tail);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code rm;
    if (std::stoi(digits) >= min_rank && std::filesystem::remove(e.path(), rm)) ++removed;
  }
  return removed;
}

bool host_offload_on_cpu() {
  const char* v = std::getenv(kHostOffloadOnCpuEnv);
  return v && std::strcmp(v, "1") == 0;
}

}  // namespace dtrain
