// Unit tests: the address an agent advertises (launcher/advertise.h) and the
// Gloo interface it hands its workers (launcher/worker_env.h).
#include <doctest/doctest.h>

#include <map>

#include "common/error.h"
#include "launcher/advertise.h"
#include "launcher/worker_env.h"

using namespace dtrain;

TEST_CASE("advertise: the route's source address, or a given one that is local") {
  // A loopback rendezvous is reached from loopback.
  launcher::Advertised a = launcher::advertise_address("", "--advertise-addr", "127.0.0.1", 29400);
  CHECK(a.addr == "127.0.0.1");
  CHECK(a.ifname == "lo");
  CHECK(launcher::advertise_address("", "x", "localhost", 29400).addr == "127.0.0.1");
  // Given: canonicalised and checked against the host's own addresses.
  CHECK(launcher::advertise_address("127.0.0.1", "--advertise-addr", "10.9.9.9", 1).addr ==
        "127.0.0.1");
  try {
    launcher::advertise_address("203.0.113.254", "--advertise-addr", "127.0.0.1", 1);
    FAIL("a foreign address was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::config);
    CHECK(e.message().find("--advertise-addr = 203.0.113.254 is not an address of this host") !=
          std::string::npos);
    CHECK(e.hint().find("127.0.0.1 (lo)") != std::string::npos);
  }
  try {
    launcher::advertise_address("node7", "cluster.rendezvous.advertise_addr", "127.0.0.1", 1);
    FAIL("a name was accepted");
  } catch (const Error& e) {
    CHECK(e.message().find("cluster.rendezvous.advertise_addr = 'node7' is not a numeric IP") !=
          std::string::npos);
  }
  try {
    launcher::advertise_address("", "x", "no-such-host.invalid", 29400);
    FAIL("an unresolvable rendezvous host was accepted");
  } catch (const Error& e) {
    CHECK(e.message().find("cannot resolve the rendezvous host 'no-such-host.invalid'") !=
          std::string::npos);
  }
}

TEST_CASE("worker env: GLOO_SOCKET_IFNAME is the advertised interface unless loopback or set") {
  rendezvous::Assignment a;
  a.mesh = dtrain::mesh::make_mesh(1, 1, 1, 1);
  a.world = 1;
  a.master_addr = "10.0.0.1";
  rendezvous::RankPlacement p;
  a.local_ranks.push_back(p);
  launcher::WorkerEnvInputs in;
  in.assignment = &a;
  auto value = [&](const std::vector<std::string>& env) {
    for (const auto& kv : env)
      if (kv.rfind("GLOO_SOCKET_IFNAME=", 0) == 0) return kv.substr(19);
    return std::string("(unset)");
  };
  in.gloo_ifname = "eth0";
  CHECK(value(launcher::worker_env(in, p)) == "eth0");
  in.gloo_ifname = "lo";
  CHECK(value(launcher::worker_env(in, p)) == "(unset)");
  in.gloo_ifname = "eth0";
  in.base = {"GLOO_SOCKET_IFNAME=ib0"};  // the user's choice wins
  CHECK(value(launcher::worker_env(in, p)) == "ib0");
}
