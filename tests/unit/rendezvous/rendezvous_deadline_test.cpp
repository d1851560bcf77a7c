// The rendezvous server keeps no gRPC deadline timer per call
// (grpc_options.h): a waiting Join whose client deadline passes must still
// leave the round, through the client's cancellation. Raw gRPC calls: the
// public client always asks the server to time the join out first.
#include <doctest/doctest.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <thread>

#include "rendezvous/grpc_options.h"
#include "rendezvous/rendezvous.grpc.pb.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/rendezvous_proto.h"
#include "rendezvous/rendezvous_server.h"

using namespace dtrain::rendezvous;

TEST_CASE("rendezvous: a join whose gRPC deadline passes leaves the round") {
  ServerOptions o;
  o.job = "job-d";
  o.token = "deadline-token";
  o.min_nodes = o.max_nodes = 2;
  o.mesh = dtrain::mesh::make_mesh(2, 1, 1, 1);
  RendezvousServer server(o);
  const std::string endpoint = "127.0.0.1:" + std::to_string(server.start("127.0.0.1:0"));

  // node-0 joins with no server-side timeout (timeout_s 0) and a 0.3-s deadline.
  const TlsIdentity tls = token_tls_identity(o.token);
  auto channel = grpc::CreateCustomChannel(endpoint, detail::client_credentials(tls),
                                           detail::client_channel_args(tls));
  auto stub = pb::Rendezvous::NewStub(channel);
  JoinInfo info;
  info.job = o.job;
  info.token = o.token;
  info.node_id = "node-0";
  info.host = "127.0.0.1";
  info.slots = 1;
  pb::JoinRequest req;
  detail::to_proto(info, 0, &req);
  pb::JoinReply reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  const grpc::Status s = stub->Join(&ctx, req, &reply);
  CHECK(s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);

  // It leaves the open round (the 30 s, 6000 polls, are a hang guard only).
  ClientOptions co;
  co.endpoint = endpoint;
  co.job = o.job;
  co.token = o.token;
  RendezvousClient status_client(co);
  size_t waiting = 1;
  for (int i = 0; i < 6000 && waiting != 0; ++i) {
    waiting = status_client.status().nodes.size();
    if (waiting) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  MESSAGE("agents waiting after the deadline: " << waiting);
  CHECK(waiting == 0);

  // node-0 can join again (no phantom of it holds the name), and the round
  // of two closes with node-1.
  auto other = std::async(std::launch::async, [&] {
    RendezvousClient c(co);
    JoinInfo one = info;
    one.node_id = "node-1";
    return c.join(one, 10).world;
  });
  RendezvousClient again(co);
  Assignment a;
  CHECK_NOTHROW(a = again.join(info, 10));
  CHECK(a.world == 2);
  int other_world = 0;
  CHECK_NOTHROW(other_world = other.get());
  CHECK(other_world == 2);
}
