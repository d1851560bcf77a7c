// env_report: the worker program of the launcher's integration tests. It
// appends its environment contract as one JSON line to <dir>/env.jsonl and
// can fail, sleep, ignore SIGTERM or check MASTER_ADDR:PORT, as told by argv.
// Not a real training worker: no torch, no collectives.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

const char* kUsage =
    "env_report [--dir DIR] [--fail-restart N] [--fail-always] [--fail-rank R]\n"
    "           [--error-message TEXT] [--sleep S] [--ignore-term R] [--check-master]\n"
    "  --dir: where env.jsonl goes (default $ENV_REPORT_DIR)\n"
    "  --fail-restart N: exit 1 when DTRAIN_RESTART == N; --fail-always: exit 1 always\n"
    "  --fail-rank R: only rank R fails (default: every rank told to fail)\n"
    "  --ignore-term R: rank R ignores SIGTERM (-1 = every rank)\n"
    "  --check-master: rank 0 listens on MASTER_ADDR:MASTER_PORT, the others connect\n";

struct Options {
  std::string dir;
  int fail_restart = -1;
  bool fail_always = false;
  int fail_rank = -1;
  std::string error_message;
  double sleep_s = 0;
  bool ignore_term = false;
  int ignore_term_rank = -1;
  bool check_master = false;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int env_int(const char* name) { return std::atoi(env(name).c_str()); }

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// Rank 0 binds the master address (what TCPStore does) and accepts one
// connection from every other rank; they connect, retrying for 20 s.
bool check_master(int rank, int world) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(env("MASTER_ADDR").c_str(), env("MASTER_PORT").c_str(), &hints, &res) != 0)
    return false;
  bool ok = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  if (rank == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ok = bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 64) == 0;
    for (int i = 1; ok && i < world; ++i) {
      int c = accept(fd, nullptr, nullptr);
      if (c < 0) ok = false;
      else close(c);
    }
    close(fd);
  } else {
    while (!ok && std::chrono::steady_clock::now() < deadline) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      ok = connect(fd, res->ai_addr, res->ai_addrlen) == 0;
      close(fd);
      if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  freeaddrinfo(res);
  return ok;
}

bool parse(int argc, char** argv, Options* o) {
  o->dir = env("ENV_REPORT_DIR");
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--dir") o->dir = next();
    else if (a == "--fail-restart") o->fail_restart = std::atoi(next().c_str());
    else if (a == "--fail-always") o->fail_always = true;
    else if (a == "--fail-rank") o->fail_rank = std::atoi(next().c_str());
    else if (a == "--error-message") o->error_message = next();
    else if (a == "--sleep") o->sleep_s = std::atof(next().c_str());
    else if (a == "--ignore-term") {
      o->ignore_term = true;
      o->ignore_term_rank = std::atoi(next().c_str());
    }
    else if (a == "--check-master") o->check_master = true;
    else return false;
  }
  return true;
}

void append_line(const std::string& dir, const std::string& line) {
  if (dir.empty()) return;
  int fd = open((dir + "/env.jsonl").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  ssize_t n = write(fd, line.data(), line.size());  // one write: lines never interleave
  (void)n;
  close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  int rank = env_int("RANK"), world = env_int("WORLD_SIZE"), restart = env_int("DTRAIN_RESTART");
  if (o.ignore_term && (o.ignore_term_rank < 0 || o.ignore_term_rank == rank))
    signal(SIGTERM, SIG_IGN);
  bool master_ok = o.check_master ? check_master(rank, world) : false;
  std::string line = "{";
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "DTRAIN_MESH", "DTRAIN_COORD",
        "DTRAIN_RESTART", "DTRAIN_SPEC", "DTRAIN_RUN_DIR", "DTRAIN_ERROR_FILE", "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "SLURM_NODEID", "SLURM_NNODES",
        "SLURM_JOB_NODELIST", "DTRAIN_TOKEN"})
    line += json_string(name) + ":" + json_string(env(name)) + ",";
  line += "\"pid\":" + std::to_string(getpid()) + ",\"pgid\":" + std::to_string(getpgrp()) +
          ",\"sid\":" + std::to_string(getsid(0)) +
          ",\"master_ok\":" + (master_ok ? "true" : "false") + "}\n";
  append_line(o.dir, line);
  std::printf("env_report rank %d restart %d pid %d\n", rank, restart, getpid());
  std::fflush(stdout);
  if (o.sleep_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(o.sleep_s));
  bool fail = o.fail_always || (o.fail_restart >= 0 && restart == o.fail_restart);
  if (fail && (o.fail_rank < 0 || o.fail_rank == rank)) {
    if (!o.error_message.empty()) {
      FILE* f = std::fopen(env("DTRAIN_ERROR_FILE").c_str(), "w");
      if (f) {
        std::fprintf(f, "{\"message\": %s}\n", json_string(o.error_message).c_str());
        std::fclose(f);
      }
    }
    std::fprintf(stderr, "env_report rank %d: failing on purpose (restart %d)\n", rank, restart);
    return 1;
  }
  return 0;
}
