// SafeOutput: how dtrain writes a file a user named (merged checkpoints, SVG,
// specs). The bytes go to a temporary file created beside the target (O_EXCL,
// O_NOFOLLOW), are fsynced, and renamed over the target only at commit(), so a
// reader never sees half a file. It refuses a symlink (never writes through a
// link), a directory or special file, and an existing file unless told to
// replace it. It does not decide where files go; callers do.
#pragma once

#include <string>

namespace dtrain {

enum class Clobber {
  refuse,   // an existing target is an error (the default everywhere)
  replace,  // --force: an existing regular file is replaced (never followed)
};

class SafeOutput {
 public:
  // path: the target; field: how the user named it in messages ("OUT",
  // "--svg"); force_flag: the flag that allows replacing ("--force"), for the
  // hint. Checks the target and creates the temporary; throws
  // dtrain::Error(config) naming field and path when the target is refused.
  SafeOutput(std::string path, std::string field, Clobber clobber,
             std::string force_flag = "--force");
  ~SafeOutput();  // removes the temporary unless committed
  SafeOutput(const SafeOutput&) = delete;
  SafeOutput& operator=(const SafeOutput&) = delete;

  const std::string& path() const { return path_; }
  // Where the bytes go until commit(): <dir>/.<name>.tmp-XXXXXX (a regular
  // file this object created; writers may reopen it by name).
  const std::string& tmp_path() const { return tmp_; }
  int fd() const { return fd_; }
  void write(const std::string& text);
  // fsync, rename onto path (refusing to replace a file that appeared in the
  // meantime under Clobber::refuse), fsync the directory.
  void commit();

 private:
  void check_target() const;

  std::string path_, field_, force_flag_;
  Clobber clobber_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// While alive, SIGINT, SIGTERM and SIGHUP first remove `out`'s temporary
// file, then end the process by the same signal (the default action), so a
// command stopped while writing leaves no temporary behind (SIGKILL cannot
// be caught). For commands whose work is writing one file (ckpt merge): it
// replaces the process's handlers of those signals while alive (restored
// after), so not for the launcher or workers. One at a time per process.
class RemoveTmpOnSignal {
 public:
  explicit RemoveTmpOnSignal(const SafeOutput& out);
  ~RemoveTmpOnSignal();
  RemoveTmpOnSignal(const RemoveTmpOnSignal&) = delete;
  RemoveTmpOnSignal& operator=(const RemoveTmpOnSignal&) = delete;
};

// One text file through SafeOutput.
void write_file_safely(const std::string& path, const std::string& text, const std::string& field,
                       Clobber clobber, const std::string& force_flag = "--force");

}  // namespace dtrain
