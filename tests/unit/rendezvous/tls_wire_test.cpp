// What crosses the loopback between a rendezvous client and server: a
// recording proxy between them (tests/support/recording_proxy.h) sees every
// byte. The token must never be among them, also not when the server is an
// impostor that does not hold the token. Identities and CA mode: tls_test.cpp.
#include <doctest/doctest.h>

#include <string>

#include "common/error.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/rendezvous_server.h"
#include "tests/support/recording_proxy.h"

using namespace dtrain::rendezvous;
using dtrain::Error;
using dtrain::ErrorCode;
using dtrain::testing::RecordingProxy;

namespace {

// Long and unlikely, so finding it in the capture can only mean the token.
const char* kWireToken = "wire-token-7f3c91e04b2d58a6";

ServerOptions one_node(const std::string& token) {
  ServerOptions o;
  o.job = "job-wire";
  o.token = token;
  o.mesh = dtrain::mesh::make_mesh(1, 1, 1, 1);
  o.heartbeat_s = 0.2;
  return o;
}

RendezvousClient client_via(const RecordingProxy& proxy, const std::string& token) {
  ClientOptions c;
  c.endpoint = "127.0.0.1:" + std::to_string(proxy.port());
  c.job = "job-wire";
  c.token = token;
  c.call_timeout_s = 5;
  return RendezvousClient(c);
}

JoinInfo node0() {
  JoinInfo j;
  j.node_id = "node-0";
  j.host = "127.0.0.1";
  j.slots = 1;
  j.master_port = 30000;
  return j;
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("rendezvous wire: join, heartbeat and status through a capture carry no token") {
  RendezvousServer server(one_node(kWireToken));
  int port = server.start("127.0.0.1:0");
  std::string capture;
  {
    RecordingProxy proxy(port);
    RendezvousClient client = client_via(proxy, kWireToken);
    Assignment a = client.join(node0(), 10);
    CHECK(a.world == 1);
    client.heartbeat("node-0", a.round);
    CHECK(client.status().nodes.size() == 1);
    capture = proxy.recorded();
  }
  MESSAGE("captured " << capture.size() << " bytes; the token in them "
                      << occurrences(capture, kWireToken) << " times");
  CHECK(capture.size() > 200);  // the calls did go through the proxy
  CHECK(occurrences(capture, kWireToken) == 0);
  CHECK(occurrences(capture, "job-wire") == 0);  // nothing else in clear either
}

TEST_CASE("rendezvous wire: an impostor server without the token gets no token, and the agent "
          "stops at once with a TLS error") {
  RendezvousServer impostor(one_node("the-impostors-own-token"));
  int port = impostor.start("127.0.0.1:0");
  RecordingProxy proxy(port);
  std::string message;
  ErrorCode code = ErrorCode::internal;
  try {
    // 60 s: a client that kept retrying the handshake would end in a
    // timeout error, not the TLS error checked below.
    client_via(proxy, kWireToken).join(node0(), 60);
  } catch (const Error& e) {
    message = e.message();
    code = e.code();
  }
  MESSAGE("agent's error: " << message);
  const std::string capture = proxy.recorded();
  MESSAGE("captured " << capture.size() << " bytes; the token in them "
                      << occurrences(capture, kWireToken) << " times");
  CHECK(occurrences(capture, kWireToken) == 0);
  CHECK(code == ErrorCode::rendezvous);
  CHECK(message.find("TLS handshake with the rendezvous server at 127.0.0.1:" +
                     std::to_string(proxy.port())) != std::string::npos);
  CHECK(message.find("not derived from this agent's token") != std::string::npos);
}
