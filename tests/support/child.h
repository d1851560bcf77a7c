// RAII child process for integration tests: posix_spawn with captured
// stdout+stderr (to a file), kill of the whole process group in the
// destructor, so a failing test never leaves processes behind.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dtrain::testing {

// DTRAIN_TEST_BINARY_DIR runs the tests against another build's dtrain (the
// code before a change, to see a new test fail there); default this build.
inline std::string dtrain_bin() {
  const char* other = std::getenv("DTRAIN_TEST_BINARY_DIR");
  return std::string(other && *other ? other : DTRAIN_BINARY_DIR) + "/apps/dtrain/dtrain";
}
inline std::string source_dir() { return DTRAIN_SOURCE_DIR; }
inline std::string binary_dir() { return DTRAIN_BINARY_DIR; }
// The Python with torch that CMake found (the project venv); "" when none.
inline std::string python() { return DTRAIN_PYTHON; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// A fresh temporary directory, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dtrain-test-XXXXXX";
    char* p = mkdtemp(tmpl);
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    if (!std::getenv("DTRAIN_KEEP_TMP")) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

class Child {
 public:
  // argv[0] is the program path. The child gets this process's environment
  // minus SLURM_* (a test run inside a SLURM allocation must not turn every
  // `dtrain launch` into a multi-node one), plus extra_env: "K=V" entries
  // that add or override, SLURM_* included. Output goes to output_path.
  Child(std::vector<std::string> argv, const std::string& output_path,
        const std::vector<std::string>& extra_env = {})
      : output_path_(output_path) {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv(*e);
      auto eq = kv.find('=');
      if (eq == std::string::npos || kv.rfind("SLURM_", 0) == 0) continue;
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& kv : extra_env) {
      auto eq = kv.find('=');
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    std::vector<std::string> env_strings;
    for (auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env_strings) cenv.push_back(e.data());
    cenv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, output_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);  // own group: the destructor kills it whole
    int rc = posix_spawn(&pid_, cargv[0], &actions, &attr, cargv.data(), cenv.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + " failed");
  }

  ~Child() { kill_all(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }

  void signal(int sig) {
    if (running()) ::kill(pid_, sig);
  }

  // Wait up to timeout_s; returns true when it exited. Status via exit_code().
  bool wait(double timeout_s) {
    if (done_) return true;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        done_ = true;
        status_ = status;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  bool running() const { return !done_; }
  // Exit code, or 128+signal when killed by a signal (like a shell).
  int exit_code() const {
    if (WIFEXITED(status_)) return WEXITSTATUS(status_);
    if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
    return -1;
  }
  std::string output() const { return read_file(output_path_); }

  // SIGKILL the whole process group (the child and anything it spawned in it).
  void kill_all() {
    ::kill(-pid_, SIGKILL);
    if (!done_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      done_ = true;
      status_ = status;
    }
  }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  int status_ = 0;
  std::string output_path_;
};

// Run to completion (killed after timeout_s). Returns {exit code, output}.
inline std::pair<int, std::string> run_command(std::vector<std::string> argv,
                                               const std::string& output_path,
                                               double timeout_s = 120,
                                               const std::vector<std::string>& extra_env = {}) {
  Child child(std::move(argv), output_path, extra_env);
  if (!child.wait(timeout_s)) {
    child.kill_all();
    return {-1, child.output() + "\n[test: timed out after " + std::to_string(timeout_s) + " s]"};
  }
  return {child.exit_code(), child.output()};
}

inline bool pid_alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// Polls every 20 ms until done() holds or timeout_s have passed; returns
// done() (asked once more at the end). For a condition another process
// brings about: no fixed sleep decides anything.
inline bool wait_until(const std::function<bool()>& done, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

}  // namespace dtrain::testing

namespace dtrain::testing {

// Every process (but this one) whose environment holds DTRAIN_TEST_TAG=<tag>.
inline std::vector<pid_t> tagged_pids(const std::string& tag) {
  std::vector<pid_t> pids;
  std::string needle = "DTRAIN_TEST_TAG=" + tag;
  FILE* ls = popen("ls /proc", "r");
  if (!ls) return pids;
  char buf[64];
  while (fgets(buf, sizeof buf, ls)) {
    int pid = std::atoi(buf);
    if (pid <= 1 || pid == getpid()) continue;
    std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
    for (auto& c : env) if (c == '\0') c = '\n';
    if (("\n" + env).find("\n" + needle + "\n") != std::string::npos) pids.push_back(pid);
  }
  pclose(ls);
  return pids;
}

// SIGKILL every process whose environment holds DTRAIN_TEST_TAG=<tag>: the
// last line of defence for workers that left their parent's process group.
inline int kill_tagged(const std::string& tag) {
  int killed = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (pid_t pid : tagged_pids(tag)) {
      ::kill(pid, SIGKILL);
      ++killed;
    }
  return killed;
}

// A unique tag for one test: pass "DTRAIN_TEST_TAG=<tag>" in extra_env and
// this guard kills every tagged process when it goes out of scope.
class TagGuard {
 public:
  TagGuard() : tag_(std::to_string(getpid()) + "-" + std::to_string(counter()++)) {}
  ~TagGuard() { kill_tagged(tag_); }
  std::string env() const { return "DTRAIN_TEST_TAG=" + tag_; }
  const std::string& tag() const { return tag_; }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string tag_;
};

}  // namespace dtrain::testing
