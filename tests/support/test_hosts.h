// Test hosts for integration tests (scripts/testhosts; docs/ARCHITECTURE.md, 'Test
// hosts: many machines on one'): an RAII `up N` ... `down`, commands wrapped to run
// inside host i's network namespace, link cuts. One test at a time holds the hosts (a
// file lock), and a test asks unavailable_reason() first so it can skip, saying why,
// where namespaces cannot be made (not root, no iproute2, a sandbox without them).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/child.h"

namespace dtrain::testing {

class TestHosts {
 public:
  static std::string script() { return source_dir() + "/scripts/testhosts"; }

  // "" when test hosts can be made here, else the reason (for the skip message).
  static std::string unavailable_reason() {
    std::string out;
    int code = run_script({"check"}, &out);
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return code == 0 ? "" : (out.empty() ? "scripts/testhosts check failed" : out);
  }

  explicit TestHosts(int n) : n_(n) {
    lock_fd_ = ::open("/run/dtrain-testhosts-test.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lock_fd_ >= 0) ::flock(lock_fd_, LOCK_EX);  // another test's hosts: wait for its down
    std::string out;
    if (run_script({"up", std::to_string(n)}, &out) != 0) {
      down();
      throw std::runtime_error("scripts/testhosts up " + std::to_string(n) + " failed:\n" + out);
    }
  }
  ~TestHosts() { down(); }
  TestHosts(const TestHosts&) = delete;
  TestHosts& operator=(const TestHosts&) = delete;

  int size() const { return n_; }
  static std::string addr(int i) { return "10.251.77." + std::to_string(10 + i); }
  static std::string netns(int i) { return "dtrain-h" + std::to_string(i); }

  // argv run inside host i's network namespace (nsenter execs it: the pid,
  // its process group and its environment are the command's own).
  static std::vector<std::string> in_host(int i, std::vector<std::string> argv) {
    std::vector<std::string> out = {"/usr/bin/nsenter", "--net=/run/netns/" + netns(i), "--"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  // Take host i's link down (a partition) or up again.
  void cut(int i) { must({"cut", std::to_string(i)}); }
  void heal(int i) { must({"heal", std::to_string(i)}); }

 private:
  static int run_script(std::vector<std::string> args, std::string* out) {
    std::string cmd = script();
    for (const auto& a : args) cmd += " " + a;
    cmd += " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return -1;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) *out += buf;
    int status = ::pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  void must(std::vector<std::string> args) {
    std::string out;
    if (run_script(args, &out) != 0) throw std::runtime_error("scripts/testhosts failed: " + out);
  }
  void down() {
    std::string out;
    run_script({"down"}, &out);
    if (lock_fd_ >= 0) ::close(lock_fd_);
    lock_fd_ = -1;
  }

  int n_ = 0;
  int lock_fd_ = -1;
};

// After a cut: heals host `host`'s link, waits (90 s) for node 0 to log
// `closed` (the round that admits the host again), then for every agent to
// exit 0 (180 s each), printing the logs where one does not.
inline void heal_and_finish(TestHosts& hosts, int host, const std::vector<std::unique_ptr<Child>>& agents,
                            const std::string& closed) {
  hosts.heal(host);
  auto out = [&](size_t i) { return agents[i]->output(); };
  REQUIRE_MESSAGE(wait_until([&] { return out(0).find(closed) != std::string::npos; }, 90),
                  "node 0:\n" << out(0) << "\nnode " << host << ":\n" << out(size_t(host)));
  for (size_t i = 0; i < agents.size(); ++i) {
    INFO("node " << i << ":\n" << out(i));
    REQUIRE(agents[i]->wait(180));
    CHECK(agents[i]->exit_code() == 0);
  }
}

}  // namespace dtrain::testing
