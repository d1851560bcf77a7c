// SafeOutput (safe_output.h): lstat checks on the target, mkostemp beside it,
// renameat2(RENAME_NOREPLACE) or rename() to publish, fsync of the directory.
#include "common/safe_output.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace dtrain {
namespace fs = std::filesystem;
namespace {

std::string parent_of(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "a special file";
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

SafeOutput::SafeOutput(std::string path, std::string field, Clobber clobber, std::string force_flag)
    : path_(std::move(path)), field_(std::move(field)), force_flag_(std::move(force_flag)),
      clobber_(clobber) {
  if (path_.empty() || path_.back() == '/')
    throw Error(ErrorCode::config, field_ + " = '" + path_ + "': not a file name",
                "name the file to write, e.g. out/model.safetensors");
  check_target();
  const std::string dir = parent_of(path_);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error(ErrorCode::config,
                field_ + " = " + path_ + ": the directory " + dir + " does not exist",
                "create it first (mkdir -p " + dir + ") or write somewhere else");
  std::string tmpl = dir + "/." + fs::path(path_).filename().string() + ".tmp-XXXXXX";
  fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);  // O_CREAT | O_EXCL: never an existing file or link
  if (fd_ < 0)
    throw Error(ErrorCode::config,
                field_ + " = " + path_ + ": cannot create a file in " + dir + ": " +
                    std::strerror(errno),
                "write to a directory you can write to");
  tmp_ = tmpl;
  ::fchmod(fd_, 0644);
}

namespace {

// RemoveTmpOnSignal's state: a fixed buffer, so the handler only calls
// async-signal-safe unlink and raise.
char g_tmp_path[4096];
volatile std::sig_atomic_t g_tmp_armed = 0;
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction g_old_actions[3];

void remove_tmp_and_die(int sig) {
  if (g_tmp_armed) ::unlink(g_tmp_path);
  ::raise(sig);  // SA_RESETHAND: the default action once this handler returns
}

}  // namespace

RemoveTmpOnSignal::RemoveTmpOnSignal(const SafeOutput& out) {
  if (g_tmp_armed || out.tmp_path().size() >= sizeof g_tmp_path)
    throw Error(ErrorCode::internal, "RemoveTmpOnSignal: one at a time, for a path under 4096 bytes");
  std::memcpy(g_tmp_path, out.tmp_path().c_str(), out.tmp_path().size() + 1);
  g_tmp_armed = 1;
  struct sigaction sa {};
  sa.sa_handler = remove_tmp_and_die;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  for (size_t i = 0; i < 3; ++i) ::sigaction(kCleanupSignals[i], &sa, &g_old_actions[i]);
}

RemoveTmpOnSignal::~RemoveTmpOnSignal() {
  g_tmp_armed = 0;
  for (size_t i = 0; i < 3; ++i) ::sigaction(kCleanupSignals[i], &g_old_actions[i], nullptr);
}

SafeOutput::~SafeOutput() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void SafeOutput::check_target() const {
  struct stat st {};
  if (::lstat(path_.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw Error(ErrorCode::config, field_ + " = " + path_ + ": " + std::strerror(errno),
                "write somewhere you can write to");
  }
  if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const std::string target = fs::read_symlink(path_, ec).string();
    throw Error(ErrorCode::config,
                field_ + " = " + path_ + " is a symbolic link (to " + target +
                    "); dtrain never writes through a link",
                "give the real path of the file to write");
  }
  if (!S_ISREG(st.st_mode))
    throw Error(ErrorCode::config,
                field_ + " = " + path_ + " is " + kind_of(st.st_mode) + ", not a file",
                "give the path of a file to write");
  if (clobber_ == Clobber::refuse)
    throw Error(ErrorCode::config,
                field_ + " = " + path_ + " already exists (" + std::to_string(st.st_size) +
                    " bytes); dtrain does not overwrite it",
                "choose another name, remove it, or pass " + force_flag_ + " to replace it");
}

void SafeOutput::write(const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error(ErrorCode::config, "writing " + field_ + " = " + path_ + " failed: " +
                                         std::strerror(errno),
                  "check the free space of its file system");
    p += n;
    left -= size_t(n);
  }
}

void SafeOutput::commit() {
  if (::fsync(fd_) != 0)
    throw Error(ErrorCode::config, "fsync of " + tmp_ + " failed: " + std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  check_target();  // a link or file that appeared since the constructor
  int rc = clobber_ == Clobber::refuse
               ? ::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE)
               : ::rename(tmp_.c_str(), path_.c_str());
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
    // No RENAME_NOREPLACE on this file system: link() also fails on an
    // existing name, then the temporary name goes.
    rc = ::link(tmp_.c_str(), path_.c_str());
    if (rc == 0) ::unlink(tmp_.c_str());
  }
  if (rc != 0) {
    const int err = errno;
    if (err == EEXIST) check_target();  // throws the "already exists" refusal
    throw Error(ErrorCode::config, "cannot move " + tmp_ + " to " + field_ + " = " + path_ +
                                       ": " + std::strerror(err));
  }
  committed_ = true;
  fsync_dir(parent_of(path_));
}

void write_file_safely(const std::string& path, const std::string& text, const std::string& field,
                       Clobber clobber, const std::string& force_flag) {
  SafeOutput out(path, field, clobber, force_flag);
  out.write(text);
  out.commit();
}

}  // namespace dtrain
