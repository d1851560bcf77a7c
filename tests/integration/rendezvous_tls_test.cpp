// The rendezvous' exposure, with the real binaries on loopback: what a
// capture between a real agent and `dtrain rendezvous` sees (no token), the
// address `dtrain rendezvous` listens on (the endpoint's, not every one),
// cluster.rendezvous.tls files (admitted / wrong CA refused / incomplete
// refused by validate), and a worker's environment (no token).
#include <doctest/doctest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <sstream>

#include "tests/support/child.h"
#include "tests/support/recording_proxy.h"

using dtrain::testing::Child;
using dtrain::testing::RecordingProxy;
using dtrain::testing::TagGuard;
using dtrain::testing::TempDir;
using json = nlohmann::json;

namespace {

const char* kToken = "itest-tls-token-5d02c8e1";

std::string env_report() { return dtrain::testing::binary_dir() + "/tests/env_report"; }

// A port free on every loopback address (bound on 0.0.0.0, then released).
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof addr;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

bool connects(const char* ip, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip, &addr.sin_addr);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

struct Job {
  TempDir dir;
  TagGuard tag;
  std::vector<std::unique_ptr<Child>> children;

  // A 1-node job of env_report workers; `rendezvous` goes into cluster.rendezvous.
  std::string spec(const std::string& rendezvous, int procs = 1) {
    std::string path = dir / "job.yaml";
    dtrain::testing::write_file(
        path, "job: {name: itest-tls}\ncluster: {nodes: 1, procs_per_node: " +
                  std::to_string(procs) + ", rendezvous: {" + rendezvous +
                  "}}\nparallel: {dp: " + std::to_string(procs) + "}\nlog: {dir: " +
                  (dir / "run") + "}\nentrypoint: ['" + env_report() + "', '--dir', '" +
                  dir.path() + "']\n");
    return path;
  }
  Child& start(std::vector<std::string> args, const std::string& name) {
    args.insert(args.begin(), dtrain::testing::dtrain_bin());
    children.push_back(std::make_unique<Child>(
        args, dir / (name + ".out"), std::vector<std::string>{tag.env(), std::string("DTRAIN_TOKEN=") + kToken}));
    return *children.back();
  }
  // Start `dtrain rendezvous` and wait for its "listening" line.
  Child& rendezvous(std::vector<std::string> args) {
    args.insert(args.begin(), "rendezvous");
    Child& c = start(std::move(args), "rendezvous");
    for (int i = 0; i < 1000 && c.output().find("listening") == std::string::npos; ++i) {
      REQUIRE_MESSAGE(!c.wait(0.02), "rendezvous ended:\n", c.output());
    }
    REQUIRE_MESSAGE(c.output().find("listening") != std::string::npos, c.output());
    return c;
  }
  std::pair<int, std::string> run(std::vector<std::string> args, const std::string& name) {
    Child& c = start(std::move(args), name);
    bool ended = c.wait(60);
    CHECK_MESSAGE(ended, "dtrain did not end:\n", c.output());
    return {ended ? c.exit_code() : -1, c.output()};
  }
  std::vector<json> reports() const {
    std::vector<json> out;
    std::istringstream in(dtrain::testing::read_file(dir / "env.jsonl"));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) out.push_back(json::parse(line));
    return out;
  }
};

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// openssl(1): an Ed25519 key and a self-signed certificate for `san`.
void make_cert(const TempDir& dir, const std::string& name,
               const std::string& san = "IP:127.0.0.1") {
  auto [code, out] = dtrain::testing::run_command(
      {"/usr/bin/openssl", "req", "-x509", "-newkey", "ed25519", "-nodes", "-days", "2",
       "-subj", "/CN=dtrain-test", "-addext", "subjectAltName=" + san, "-keyout",
       dir / (name + ".key"), "-out", dir / (name + ".pem")},
      dir / (name + ".openssl.out"), 30);
  REQUIRE_MESSAGE(code == 0, out);
}

}  // namespace

TEST_CASE("a real agent's traffic to `dtrain rendezvous`, recorded, carries no token") {
  Job job;
  std::string spec = job.spec("join_timeout_s: 30");
  Child& server = job.rendezvous({spec, "--host", "127.0.0.1", "--port", "0"});
  const std::string line = server.output();
  const int port = std::stoi(line.substr(line.find("127.0.0.1:") + 10));
  std::string capture;
  {
    RecordingProxy proxy(port);
    auto [code, out] = job.run({"launch", spec, "--rdzv",
                                "127.0.0.1:" + std::to_string(proxy.port())}, "agent");
    CHECK_MESSAGE(code == 0, out);
    capture = proxy.recorded();
  }
  MESSAGE("captured " << capture.size() << " bytes between the agent and the server; the token "
                      "in them " << occurrences(capture, kToken) << " times");
  CHECK(capture.size() > 200);
  CHECK(occurrences(capture, kToken) == 0);
  CHECK(occurrences(capture, "itest-tls") == 0);  // the job name: nothing in clear
}

TEST_CASE("`dtrain rendezvous` listens on the endpoint's address, not on every address") {
  Job job;
  const int port = free_port();
  std::string spec = job.spec("endpoint: '127.0.0.1:" + std::to_string(port) + "'");
  Child& server = job.rendezvous({spec});
  MESSAGE(server.output());
  CHECK(server.output().find("rendezvous listening on 127.0.0.1:" + std::to_string(port)) !=
        std::string::npos);
  CHECK(connects("127.0.0.1", port));
  // Another address of this machine (all of 127/8 is loopback on Linux).
  CHECK_FALSE(connects("127.0.0.2", port));
}

TEST_CASE("one-machine launch: the workers' environment holds no token") {
  Job job;
  std::string spec = job.spec("", 2);
  auto [code, out] = job.run({"launch", spec}, "launch");
  REQUIRE_MESSAGE(code == 0, out);
  auto reports = job.reports();
  REQUIRE(reports.size() == 2);
  for (const auto& r : reports) {
    MESSAGE("rank " << r["RANK"] << ": DTRAIN_TOKEN = " << r["DTRAIN_TOKEN"]);
    CHECK(r["DTRAIN_TOKEN"] == "");
    CHECK(r["RANK"] != "");  // the report itself is there
  }
}

TEST_CASE("cluster.rendezvous.tls files: the CA's agent joins, another CA's is refused") {
  Job job;
  make_cert(job.dir, "a");
  make_cert(job.dir, "b");
  const std::string tls = "tls: {ca: " + (job.dir / "a.pem") + ", cert: " + (job.dir / "a.pem") +
                          ", key: " + (job.dir / "a.key") + "}, join_timeout_s: 30";
  std::string spec = job.spec(tls);
  Child& server = job.rendezvous({spec, "--host", "127.0.0.1", "--port", "0"});
  const std::string line = server.output();
  const std::string rdzv = "127.0.0.1:" + std::to_string(std::stoi(line.substr(line.find("127.0.0.1:") + 10)));
  CHECK(line.find("TLS: " + (job.dir / "a.pem") + " (sha256 ") != std::string::npos);

  auto [bad, bad_out] = job.run({"launch", spec, "--rdzv", rdzv, "--set",
                                 "cluster.rendezvous.tls.ca=" + (job.dir / "b.pem")}, "wrong-ca");
  MESSAGE(bad_out);
  CHECK(bad == 1);
  CHECK(bad_out.find("TLS handshake with the rendezvous server at " + rdzv) != std::string::npos);
  CHECK(bad_out.find("not signed by cluster.rendezvous.tls.ca") != std::string::npos);

  auto [good, good_out] = job.run({"launch", spec, "--rdzv", rdzv}, "agent");
  CHECK_MESSAGE(good == 0, good_out);

  auto [half, half_out] = job.run({"validate", spec, "--set", "cluster.rendezvous.tls.key=''",
                                   "--set", "cluster.rendezvous.tls.cert=''"}, "validate");
  MESSAGE(half_out);
  CHECK(half == 2);
  CHECK(half_out.find("cluster.rendezvous.tls: ca, cert and key go together; cert, key missing") !=
        std::string::npos);
}

TEST_CASE("one-machine launch ignores cluster.rendezvous.tls (its own server, on loopback)") {
  Job job;
  make_cert(job.dir, "node0", "DNS:node0.example");  // a multi-node cert: not for 127.0.0.1
  std::string spec = job.spec("tls: {ca: " + (job.dir / "node0.pem") + ", cert: " +
                              (job.dir / "node0.pem") + ", key: " + (job.dir / "node0.key") + "}");
  auto [code, out] = job.run({"launch", spec}, "launch");
  CHECK_MESSAGE(code == 0, out);
  CHECK(job.reports().size() == 1);
}
