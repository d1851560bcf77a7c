// The agent's side of the rendezvous: one object per agent, every call with
// a deadline; grpc::Status is turned into dtrain::Error here and nowhere else.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rendezvous/rendezvous_types.h"
#include "rendezvous/tls.h"

namespace grpc {
class ClientContext;
}

namespace dtrain::rendezvous {

// Ends a waiting heartbeat (RendezvousClient::wait_heartbeat) from another
// thread: cancel() ends the call in flight and makes every later one return
// at once.
class CallCancel {
 public:
  void cancel();

 private:
  friend class RendezvousClient;
  std::mutex mutex_;
  bool cancelled_ = false;
  grpc::ClientContext* in_flight_ = nullptr;
};

struct ClientOptions {
  std::string endpoint = "127.0.0.1:29400";
  std::string job;                // sent with every call
  std::string token;              // sent with every call (checked by the server)
  double call_timeout_s = 10.0;   // deadline of the short calls
  TlsIdentity tls;                // empty: derived from the token (tls.h)
};

class RendezvousClient {
 public:
  explicit RendezvousClient(ClientOptions options);
  ~RendezvousClient();

  // Long-poll until the round closes. Throws Error(rendezvous) on refusal
  // (wrong token/job, duplicate node, too many nodes) with the server's
  // reason, or at once when the TLS handshake fails (a server that does not
  // prove the token or the CA), Error(timeout) when timeout_s passes
  // ("joined 1 of 2 nodes").
  Assignment join(const JoinInfo& info, double timeout_s);
  HeartbeatReply heartbeat(const std::string& node_id, uint64_t round,
                           const std::vector<trace::RankProgress>& ranks = {});
  // A heartbeat the server may hold up to wait_s, answering as soon as the
  // round moves on (or at once when it already has). nullopt: cancelled.
  std::optional<HeartbeatReply> wait_heartbeat(const std::string& node_id, uint64_t round,
                                               const std::vector<trace::RankProgress>& ranks,
                                               double wait_s, CallCancel& cancel);
  void report_failure(const FailureReport& report);
  void leave(const std::string& node_id, bool success);
  // with_placement: also the last closed round's whole placement.
  ServerStatus status(bool with_placement = false);
  // Later calls go over a new connection (calls in flight finish on theirs).
  // After a partition the old TCP connection is no use: each segment lost
  // while the link was down doubled its retransmission timeout, so a reply
  // the server queued on it then (a held heartbeat's answer) holds every
  // later reply, a join's included, for up to seconds after the link
  // returns; a node re-admitted that late is declared dead again at once.
  void reconnect();
  // Waits up to timeout_s for the current connection to be up; false if not.
  bool wait_connected(double timeout_s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::rendezvous
