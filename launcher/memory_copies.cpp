// MemoryCopies (memory_copies.h).
#include "launcher/memory_copies.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <vector>

#include "common/log.h"

namespace dtrain::launcher {

namespace {

// Node ids are "address:pid"; job names are free text: only [A-Za-z0-9._-] in a file name.
std::string file_safe(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-') ? c : '_';
  return out;
}

}  // namespace

std::unique_ptr<MemoryCopies> MemoryCopies::create(const std::string& job, const std::string& node_id) {
  const std::string dir = "/dev/shm/dtrain-mem-" + file_safe(job) + "-" + file_safe(node_id);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // a stale one of a pid reused: not this run's state
  if (::mkdir(dir.c_str(), 0700) != 0) {
    DTRAIN_WARN("checkpoint.memory: cannot make {} ({}): no in-memory copies on this node; restarts read "
                "checkpoint.dir", dir, std::error_code(errno, std::generic_category()).message());
    return nullptr;
  }
  return std::unique_ptr<MemoryCopies>(new MemoryCopies(dir));
}

int MemoryCopies::clear() {
  std::error_code ec;
  std::vector<std::filesystem::path> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) entries.push_back(e.path());
  for (const auto& e : entries) std::filesystem::remove_all(e, ec);
  return int(entries.size());
}

MemoryCopies::~MemoryCopies() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace dtrain::launcher
