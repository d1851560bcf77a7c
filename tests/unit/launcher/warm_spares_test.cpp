// Unit tests: warm spares (launcher/warm_spares.h) with `sh` standing in for
// dtrain-worker: take() hands the spare started by fill() (same pid) the
// whole environment on its stdin; a changed load-time variable discards it;
// an idle spare does not outlive WarmSpares.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launcher/warm_spares.h"

using dtrain::launcher::load_time_env;
using dtrain::launcher::Process;
using dtrain::launcher::spare_payload;
using dtrain::launcher::WarmSpares;
using dtrain::launcher::WorkerSpec;

namespace {

std::string temp_path(const std::string& name) {
  return "/tmp/dtrain_warm_spares_test_" + std::to_string(::getpid()) + "_" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A spare that copies its stdin to `out` and exits at EOF.
WorkerSpec copier(const std::string& out, const std::string& omp) {
  WorkerSpec spec;
  spec.argv = {"sh", "-c", "cat > " + out};
  spec.env = {"PATH=/usr/bin:/bin", "OMP_NUM_THREADS=" + omp, "RANK=0"};
  return spec;
}

bool exits_within(Process& p, double seconds) {
  for (int i = 0; i < int(seconds * 100); ++i) {
    if (p.try_reap() || p.exited()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST_CASE("warm spares: load_time_env keeps the loader's, OpenMP's, BLAS's, malloc's and torch's variables, sorted") {
  const std::vector<std::string> env = {"RANK=3", "OMP_NUM_THREADS=2", "LD_LIBRARY_PATH=/x", "MASTER_PORT=1",
                                        "MALLOC_ARENA_MAX=2", "TORCH_SHOW_CPP_STACKTRACES=1", "HOME=/root"};
  CHECK(load_time_env(env) == std::vector<std::string>{"LD_LIBRARY_PATH=/x", "MALLOC_ARENA_MAX=2",
                                                       "OMP_NUM_THREADS=2", "TORCH_SHOW_CPP_STACKTRACES=1"});
  CHECK(spare_payload({"A=1", "B=2"}) == std::string("A=1\0B=2\0\0", 9));
}

TEST_CASE("warm spares: take() returns the process fill() started, which reads the new environment on stdin") {
  const std::string out = temp_path("copy");
  WarmSpares spares(nullptr);
  spares.fill({copier(out, "2")});
  const pid_t started = spares.pid(0);
  REQUIRE(started > 0);
  WorkerSpec next = copier(out, "2");
  next.env = {"PATH=/usr/bin:/bin", "OMP_NUM_THREADS=2", "RANK=5", "WORLD_SIZE=6"};
  auto p = spares.take(0, next);
  REQUIRE(p);
  CHECK(p->pid() == started);
  CHECK(spares.pid(0) == -1);  // taken: the slot is empty until the next fill
  REQUIRE(exits_within(*p, 30));  // hang guard: cat ends at the pipe's EOF
  CHECK(slurp(out) == spare_payload(next.env));
  std::remove(out.c_str());
}

TEST_CASE("warm spares: a changed load-time variable discards the spare; an idle one dies with WarmSpares") {
  const std::string out = temp_path("unused");
  pid_t idle = -1;
  {
    WarmSpares spares(nullptr);
    spares.fill({copier(out, "2")});
    const pid_t first = spares.pid(0);
    REQUIRE(first > 0);
    CHECK_FALSE(spares.take(0, copier(out, "4")));  // OMP_NUM_THREADS 2 -> 4: libgomp read 2 at load
    CHECK(::kill(first, 0) != 0);                   // killed and reaped
    spares.fill({copier(out, "2")});
    idle = spares.pid(0);
    REQUIRE(idle > 0);
    CHECK(idle != first);
  }
  CHECK(::kill(idle, 0) != 0);
  std::remove(out.c_str());
}
