// checkpoint_dir.h: rename-based atomic commit with fsync of files and
// directories, so a crash at any point leaves `latest` on a complete one.
#include "common/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "common/checkpoint_index.h"
#include "common/error.h"
#include "common/log.h"
#include "common/safetensors.h"

namespace dtrain::checkpoint {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void fail(const std::string& msg, const std::string& hint = {}) {
  throw Error(ErrorCode::checkpoint, msg, hint);
}

bool parse_step_dir(const std::string& name, int64_t* step) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5) return false;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  *step = std::stoll(name.substr(5));
  return true;
}

// The first line of a small file (`latest`), read without blocking on a FIFO.
std::string read_line(const std::string& path) {
  std::string line = safetensors::read_regular(path, "checkpoint pointer", 4096);
  line = line.substr(0, line.find('\n'));
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

}  // namespace

std::string step_dir_name(int64_t step) { return "step_" + std::to_string(step); }

std::string tmp_dir(const std::string& root, int64_t step) {
  return root + "/" + step_dir_name(step) + ".tmp";
}

void prepare_tmp_dir(const std::string& root, int64_t step) {
  std::error_code ec;
  fs::create_directories(root, ec);
  const std::string tmp = tmp_dir(root, step);
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec)
    fail("cannot create checkpoint directory " + tmp + ": " + ec.message(),
         "check that checkpoint.dir is writable");
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open " + path + " to fsync: " + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) fail("fsync " + path + " failed: " + std::strerror(err));
}

void commit(const std::string& root, int64_t step, int keep) {
  const std::string tmp = tmp_dir(root, step);
  const std::string final_dir = root + "/" + step_dir_name(step);
  for (const auto& e : fs::directory_iterator(tmp))
    if (e.is_regular_file()) fsync_path(e.path().string());
  fsync_path(tmp);
  std::error_code ec;
  if (fs::exists(final_dir)) {  // the same step saved again (e.g. resumed at the end)
    const std::string old = final_dir + ".old.tmp";
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) fail("cannot move aside " + final_dir + ": " + ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) fail("cannot rename " + tmp + " to " + final_dir + ": " + ec.message());
  fsync_path(root);
  set_latest(root, step);
  fs::remove_all(final_dir + ".old.tmp", ec);
  if (keep <= 0) return;
  if (const std::string archive = archive_of(root); !archive.empty()) {
    DTRAIN_WARN("checkpoint.dir = {} lies in {}, a directory of moved-aside steps: nothing there is "
                "pruned (checkpoint.keep = {} ignored)", root, archive, keep);
    return;
  }
  std::vector<int64_t> steps = list_steps(root);
  for (size_t i = 0; i + size_t(keep) < steps.size(); ++i)
    if (steps[i] != step) fs::remove_all(root + "/" + step_dir_name(steps[i]), ec);
}

void set_latest(const std::string& root, int64_t step) {
  const std::string latest_tmp = root + "/" + kLatestFile + ".tmp";
  std::error_code ec;
  fs::remove(latest_tmp, ec);  // a link or leftover there is never written through
  {
    std::ofstream out(latest_tmp, std::ios::trunc);
    out << step_dir_name(step) << "\n";
    if (!out.flush()) fail("cannot write " + latest_tmp);
  }
  fsync_path(latest_tmp);
  fs::rename(latest_tmp, root + "/" + kLatestFile, ec);
  if (ec) fail("cannot rename " + latest_tmp + " to latest: " + ec.message());
  fsync_path(root);
}

std::string move_aside(const std::string& root, const std::vector<std::string>& names) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  std::string aside = root + "/previous_" + stamp;
  for (int i = 2; fs::exists(aside); ++i) aside = root + "/previous_" + stamp + "_" + std::to_string(i);
  std::error_code ec;
  if (!fs::create_directory(aside, ec))
    fail("cannot create " + aside + ": " + ec.message(), "check that checkpoint.dir is writable");
  for (const auto& name : names) {
    fs::rename(root + "/" + name, aside + "/" + name, ec);
    if (ec) fail("cannot move " + root + "/" + name + " into " + aside + ": " + ec.message());
  }
  fsync_path(aside);
  fsync_path(root);
  return aside;
}

int clean_stale(const std::string& root) {
  int removed = 0;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return 0;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      fs::remove_all(e.path(), ec);
      ++removed;
    }
  }
  return removed;
}

std::vector<int64_t> list_steps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return steps;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    int64_t s = 0;
    if (e.is_directory() && parse_step_dir(e.path().filename().string(), &s)) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string latest_dir(const std::string& root) {
  const std::string latest = root + "/" + kLatestFile;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(latest, ec))) return "";
  const std::string name = read_line(latest);
  const std::string dir = root + "/" + name;
  int64_t step = 0;
  if (!is_plain_file_name(name) || !parse_step_dir(name, &step))
    fail(latest + " names \"" + name.substr(0, 200) + "\", which is not a step_<N> directory of " + root +
             "; `latest` must name one of its own checkpoint's steps and is not followed elsewhere",
         "resume from an existing step (dtrain launch SPEC --resume-from " + root +
             "/step_<N>) or the checkpoint you meant (--resume-from DIR), or start afresh with "
             "dtrain launch SPEC --fresh (moves the old steps aside into previous_<time>/)");
  if (!fs::is_directory(fs::symlink_status(dir, ec)))
    fail(latest + " names \"" + name + "\", which is not a checkpoint directory" +
             (fs::is_symlink(fs::symlink_status(dir, ec)) ? " (it is a symbolic link)" : ""),
         "resume from an existing step (dtrain launch SPEC --resume-from " + root +
             "/step_<N>), or start afresh with dtrain launch SPEC --fresh (moves the old steps "
             "aside into previous_<time>/)");
  return dir;
}

std::string resolve(const std::string& path) {
  if (fs::is_regular_file(path + "/" + kIndexFile)) return path;
  if (fs::is_directory(path)) {
    std::string dir = latest_dir(path);
    if (!dir.empty()) return dir;
    fail(path + " is neither a checkpoint (no " + kIndexFile + ") nor a checkpoint root (no " +
             kLatestFile + ")",
         "pass a run's checkpoint.dir or one of its step_<N> directories");
  }
  if (fs::is_regular_file(path) && fs::path(path).filename() == kLatestFile)
    return latest_dir(fs::path(path).parent_path().string());
  fail("checkpoint " + path + " does not exist");
}

bool is_archive_name(const std::string& name) {
  // previous_ YYYYMMDD T HHMMSS Z [_N]
  const std::string p = "previous_";
  if (name.size() < p.size() + 16 || name.compare(0, p.size(), p) != 0) return false;
  const std::string stamp = name.substr(p.size());
  for (size_t i = 0; i < 15; ++i)
    if (i == 8 ? stamp[i] != 'T' : (stamp[i] < '0' || stamp[i] > '9')) return false;
  if (stamp[15] != 'Z') return false;
  if (stamp.size() == 16) return true;
  if (stamp[16] != '_' || stamp.size() == 17) return false;
  return std::all_of(stamp.begin() + 17, stamp.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string archive_of(const std::string& path) {
  std::error_code ec;
  const fs::path real = fs::weakly_canonical(fs::absolute(path), ec);
  for (const fs::path& p : {fs::absolute(path).lexically_normal(), ec ? fs::path() : real}) {
    fs::path prefix;
    for (const auto& part : p) {
      prefix /= part;
      if (is_archive_name(part.string())) return prefix.string();
    }
  }
  return "";
}

std::string owning_root(const std::string& dir) {
  fs::path p = fs::absolute(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  int64_t step = 0;
  return parse_step_dir(p.filename().string(), &step) ? p.parent_path().string() : p.string();
}

namespace {

// The real directory of a path's parent plus its last name (the name itself
// is not resolved: a link named OUT is OUT, not its target).
fs::path real_location(const std::string& path) {
  fs::path p = fs::absolute(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  std::error_code ec;
  fs::path parent = fs::weakly_canonical(p.parent_path(), ec);
  return (ec ? p.parent_path() : parent) / p.filename();
}

bool is_within(const fs::path& inner, const fs::path& outer) {
  auto rel = inner.lexically_relative(outer);
  return !rel.empty() && *rel.begin() != "..";
}

}  // namespace

void check_outside(const std::string& out, const std::string& field, const std::string& given,
                   const std::string& dir) {
  const fs::path target = real_location(out);
  for (const std::string& src : {given, dir, owning_root(dir)}) {
    std::error_code ec;
    fs::path root = fs::weakly_canonical(fs::absolute(src), ec);
    if (ec) continue;
    if (is_within(target, root))
      throw Error(ErrorCode::config,
                  field + " = " + out + " is inside the checkpoint being read (" + root.string() +
                      "); writing there would clobber it",
                  "write the output outside " + root.string() +
                      ", e.g. " + (root.parent_path() / "merged.safetensors").string());
  }
}

}  // namespace dtrain::checkpoint
