// One rendezvous server per port: gRPC would bind a second server beside the
// first (SO_REUSEPORT) and split a job's agents between them. The second
// start() must fail at once, naming the port and the process that has it.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>

#include "common/error.h"
#include "common/port_owner.h"
#include "rendezvous/rendezvous_server.h"

using namespace dtrain::rendezvous;

namespace {

ServerOptions options() {
  ServerOptions o;
  o.job = "port-test";
  o.token = "t";
  return o;
}

std::string start_error(RendezvousServer& server, const std::string& address) {
  try {
    server.start(address);
  } catch (const dtrain::Error& e) {
    CHECK(e.code() == dtrain::ErrorCode::rendezvous);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("rendezvous: a second server on a taken port fails at once, naming the holder") {
  RendezvousServer first(options());
  const int port = first.start("127.0.0.1:0");
  REQUIRE(port > 0);
  const std::string me = "pid " + std::to_string(getpid());
  CHECK(dtrain::port_owner(port).rfind(me, 0) == 0);

  // "At once": the refusal costs about what a start on a free port plus the
  // owner look-up cost, measured here, not a fixed bound (no retry loop).
  const auto seconds_of = [](const std::function<void()>& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  RendezvousServer free_one(options());
  const double start_s = seconds_of([&] { CHECK(free_one.start("127.0.0.1:0") > 0); });
  const double owner_s = seconds_of([&] { CHECK(!dtrain::port_owner(port).empty()); });
  for (const std::string host : {"127.0.0.1", "0.0.0.0"}) {
    CAPTURE(host);
    RendezvousServer second(options());
    std::string e;
    const double s = seconds_of([&] { e = start_error(second, host + ":" + std::to_string(port)); });
    CHECK(e.find("port " + std::to_string(port) + " is in use (by " + me) != std::string::npos);
    MESSAGE("refused in " << s << " s; a free start " << start_s << " s, the owner look-up " << owner_s << " s");
    CHECK(s < 10 * (start_s + owner_s));
  }
}

TEST_CASE("port_owner: a free port has no owner") {
  RendezvousServer s(options());
  const int port = s.start("127.0.0.1:0");
  s.shutdown();
  CHECK(dtrain::port_owner(port) == "");
}
