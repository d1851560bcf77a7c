// RendezvousClient: one TLS channel per agent at a time (reconnect() opens a new one), a deadline on every call, and
// the single place where grpc::Status becomes dtrain::Error (status_to_error,
// tls_error).
#include "rendezvous/rendezvous_client.h"

#include <chrono>
#include <mutex>

#include "common/error.h"
#include "rendezvous/grpc_options.h"
#include "rendezvous/rendezvous.grpc.pb.h"
#include "rendezvous/rendezvous_proto.h"

namespace dtrain::rendezvous {
namespace {

std::chrono::system_clock::time_point deadline_after(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(seconds));
}

// The adapter: every failed call goes through here.
Error status_to_error(const grpc::Status& s, const std::string& endpoint, const char* call) {
  const std::string server_msg = s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return Error(ErrorCode::rendezvous, "rendezvous at " + endpoint + " refused " + call +
                                              ": " + server_msg);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return Error(ErrorCode::timeout,
                   server_msg.empty() || server_msg == "Deadline Exceeded"
                       ? std::string("rendezvous ") + call + " to " + endpoint + " timed out"
                       : server_msg,
                   "start the missing agents, or raise cluster.rendezvous.join_timeout_s");
    case grpc::StatusCode::UNAVAILABLE:
      return Error(ErrorCode::rendezvous,
                   std::string("cannot reach the rendezvous server at ") + endpoint + " (" + call +
                       ": " + server_msg + "): is the rendezvous server running?",
                   "start it (`dtrain rendezvous SPEC --port P`, or node 0's `dtrain launch`) "
                   "and check cluster.rendezvous.endpoint / --rdzv");
    default:
      return Error(ErrorCode::rendezvous, std::string("rendezvous ") + call + " to " + endpoint +
                                              " failed (gRPC code " +
                                              std::to_string(static_cast<int>(s.error_code())) +
                                              "): " + server_msg);
  }
}

bool is_tls_failure(const std::string& message) {
  for (const char* m : {"handshake", "Handshake", "SSL_ERROR", "certificate", "Certificate"})
    if (message.find(m) != std::string::npos) return true;
  return false;
}

Error tls_error(const grpc::Status& s, const ClientOptions& o) {
  const std::string head = "TLS handshake with the rendezvous server at " + o.endpoint +
                           " failed (" + s.error_message() + "): ";
  if (o.tls.mutual)
    return Error(ErrorCode::rendezvous,
                 head + "its certificate is not signed by cluster.rendezvous.tls.ca, does not "
                        "name the endpoint's host, or it refused this node's certificate",
                 "give every node the same CA in cluster.rendezvous.tls.ca, and the server a "
                 "certificate for the host in cluster.rendezvous.endpoint / --rdzv");
  return Error(ErrorCode::rendezvous,
               head + "its certificate is not derived from this agent's token (wrong token, or "
                      "the server uses cluster.rendezvous.tls files)",
               "set DTRAIN_TOKEN (or cluster.rendezvous.token_file) to the job's token on every "
               "node, and the same cluster.rendezvous.tls everywhere");
}

}  // namespace

struct RendezvousClient::Impl {
  ClientOptions options;
  // The connection calls use; reconnect() swaps in a new one while other
  // threads' calls finish on the one they took (conn()).
  struct Conn {
    std::shared_ptr<grpc::Channel> channel;
    std::shared_ptr<pb::Rendezvous::Stub> stub;
  };
  mutable std::mutex conn_mutex;
  Conn current;

  Conn conn() const {
    std::lock_guard<std::mutex> lock(conn_mutex);
    return current;
  }
  void open_connection() {
    // A channel of its own subchannel pool: a second channel with the same
    // arguments would otherwise share the first one's TCP connection.
    grpc::ChannelArguments args = detail::client_channel_args(options.tls);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    Conn c;
    c.channel = grpc::CreateCustomChannel(options.endpoint, detail::client_credentials(options.tls), args);
    c.stub = pb::Rendezvous::NewStub(c.channel);
    std::lock_guard<std::mutex> lock(conn_mutex);
    current = std::move(c);
  }

  void set_auth(pb::Auth* auth) const {
    auth->set_job(options.job);
    auth->set_token(options.token);
  }
  void short_call(grpc::ClientContext& ctx) const {
    ctx.set_deadline(deadline_after(options.call_timeout_s));
  }
  [[noreturn]] void fail(const grpc::Status& s, const char* call) const {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && is_tls_failure(s.error_message()))
      throw tls_error(s, options);
    Error e = status_to_error(s, options.endpoint, call);
    // TLS 1.3: a server that refuses the client's certificate just closes
    // the connection after the handshake; the client cannot tell why.
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && options.tls.mutual)
      throw Error(e.code(),
                  e.message() + "; or it refused this node's certificate (TLS handshake: "
                                "cluster.rendezvous.tls.cert must be signed by the server's "
                                "tls.ca)",
                  e.hint());
    throw e;
  }
  Error join_timeout(const grpc::Status& s, const std::string& node_id, double timeout_s);
  bool check_handshake(std::chrono::system_clock::time_point deadline) const;
};

// A call that waits for the server (Join) would wait out its whole deadline
// on a server whose certificate this side refuses: the channel retries the
// handshake. Follow the channel's state until it connects; whenever it has
// failed, a fail-fast call returns the failure's reason at once, and a TLS
// failure (unlike "connection refused": the server not up yet) ends the wait.
// True when connected; false at the deadline.
bool RendezvousClient::Impl::check_handshake(std::chrono::system_clock::time_point deadline) const {
  const Conn c = conn();
  const auto& channel = c.channel;
  const auto& stub = c.stub;
  for (;;) {
    grpc_connectivity_state state = channel->GetState(true);
    if (state == GRPC_CHANNEL_READY) return true;
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      pb::StatusRequest req;
      pb::StatusReply reply;
      set_auth(req.mutable_auth());
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline_after(options.call_timeout_s));
      grpc::Status s = stub->Status(&ctx, req, &reply);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return true;  // it answered
      if (is_tls_failure(s.error_message())) throw tls_error(s, options);
      // Mutual TLS: a server that refuses this node's certificate closes the
      // connection before it is ready (a server not up refuses the connection).
      if (options.tls.mutual && s.error_message().find("Socket closed") != std::string::npos)
        fail(s, "join");
    }
    if (!channel->WaitForStateChange(state, deadline)) return false;
  }
}

// The server normally answers a timed-out join itself ("joined K of M").
// If its answer did not arrive (server gone, network), ask Status for K of M.
Error RendezvousClient::Impl::join_timeout(const grpc::Status& s, const std::string& node_id,
                                           double timeout_s) {
  if (s.error_message().find("joined ") != std::string::npos)
    return status_to_error(s, options.endpoint, "join");
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", timeout_s);
  std::string head = std::string("rendezvous timed out after ") + secs + " s: ";
  pb::StatusRequest req;
  pb::StatusReply reply;
  set_auth(req.mutable_auth());
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline_after(std::min(options.call_timeout_s, 2.0)));
  grpc::Status st = conn().stub->Status(&ctx, req, &reply);
  if (!st.ok())
    return Error(ErrorCode::timeout,
                 head + "no answer from the rendezvous server at " + options.endpoint +
                     ": is the rendezvous server running?",
                 "start it, and check cluster.rendezvous.endpoint / --rdzv");
  int others = 0;
  for (const auto& n : reply.nodes()) others += n.node_id() != node_id ? 1 : 0;
  int need = reply.min_nodes() < reply.max_nodes() ? reply.min_nodes() : reply.max_nodes();
  return Error(ErrorCode::timeout,
               head + "joined " + std::to_string(others + 1) + " of " + std::to_string(need) +
                   " nodes in round " + std::to_string(reply.round()),
               "start the missing agents, or raise cluster.rendezvous.join_timeout_s");
}

RendezvousClient::RendezvousClient(ClientOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  detail::disable_mutex_deadlock_detection();
  TlsIdentity& tls = impl_->options.tls;
  if (tls.derived()) tls = token_tls_identity(impl_->options.token);
  impl_->open_connection();
}

RendezvousClient::~RendezvousClient() = default;

void RendezvousClient::reconnect() { impl_->open_connection(); }

bool RendezvousClient::wait_connected(double timeout_s) {
  const auto c = impl_->conn();
  const auto deadline = deadline_after(timeout_s);
  for (;;) {
    const grpc_connectivity_state state = c.channel->GetState(true);
    if (state == GRPC_CHANNEL_READY) return true;
    if (!c.channel->WaitForStateChange(state, deadline)) return false;
  }
}

Assignment RendezvousClient::join(const JoinInfo& info, double timeout_s) {
  pb::JoinRequest req;
  pb::JoinReply reply;
  JoinInfo sent = info;
  if (sent.job.empty()) sent.job = impl_->options.job;
  if (sent.token.empty()) sent.token = impl_->options.token;
  detail::to_proto(sent, timeout_s, &req);
  const bool connected = impl_->check_handshake(deadline_after(timeout_s));
  grpc::ClientContext ctx;
  // Connected: the call fails rather than waits if the connection drops (a
  // TLS 1.3 server that refuses this node's certificate closes it after the
  // handshake; waiting would retry it until the deadline). Not connected by
  // the deadline: wait, so the timeout is reported as one ("joined K of M").
  ctx.set_wait_for_ready(!connected);
  ctx.set_deadline(deadline_after(timeout_s + detail::kJoinDeadlineGraceS));
  grpc::Status s = impl_->conn().stub->Join(&ctx, req, &reply);
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
    throw impl_->join_timeout(s, sent.node_id, timeout_s);
  if (!s.ok()) impl_->fail(s, "join");
  return detail::from_proto(reply);
}

HeartbeatReply RendezvousClient::heartbeat(const std::string& node_id, uint64_t round,
                                          const std::vector<trace::RankProgress>& ranks) {
  CallCancel never;
  return *wait_heartbeat(node_id, round, ranks, 0, never);
}

void CallCancel::cancel() {
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_ = true;
  if (in_flight_) in_flight_->TryCancel();
}

std::optional<HeartbeatReply> RendezvousClient::wait_heartbeat(
    const std::string& node_id, uint64_t round, const std::vector<trace::RankProgress>& ranks,
    double wait_s, CallCancel& cancel) {
  pb::HeartbeatRequest req;
  pb::HeartbeatReply reply;
  impl_->set_auth(req.mutable_auth());
  req.set_node_id(node_id);
  req.set_round(round);
  req.set_wait_s(wait_s);
  for (const auto& p : ranks) detail::to_proto(p, req.add_ranks());
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline_after(wait_s + impl_->options.call_timeout_s));
  {
    std::lock_guard<std::mutex> lock(cancel.mutex_);
    if (cancel.cancelled_) return std::nullopt;
    cancel.in_flight_ = &ctx;
  }
  grpc::Status s = impl_->conn().stub->Heartbeat(&ctx, req, &reply);
  {
    std::lock_guard<std::mutex> lock(cancel.mutex_);
    cancel.in_flight_ = nullptr;
    if (cancel.cancelled_) return std::nullopt;
  }
  if (!s.ok()) impl_->fail(s, "heartbeat");
  return HeartbeatReply{reply.known(), reply.current_round(), reply.failure()};
}

void RendezvousClient::report_failure(const FailureReport& report) {
  pb::FailureRequest req;
  pb::FailureReply reply;
  detail::to_proto(report, &req);
  impl_->set_auth(req.mutable_auth());
  grpc::ClientContext ctx;
  impl_->short_call(ctx);
  grpc::Status s = impl_->conn().stub->ReportFailure(&ctx, req, &reply);
  if (!s.ok()) impl_->fail(s, "report_failure");
}

void RendezvousClient::leave(const std::string& node_id, bool success) {
  pb::LeaveRequest req;
  pb::LeaveReply reply;
  impl_->set_auth(req.mutable_auth());
  req.set_node_id(node_id);
  req.set_success(success);
  grpc::ClientContext ctx;
  impl_->short_call(ctx);
  grpc::Status s = impl_->conn().stub->Leave(&ctx, req, &reply);
  if (!s.ok()) impl_->fail(s, "leave");
}

ServerStatus RendezvousClient::status(bool with_placement) {
  pb::StatusRequest req;
  pb::StatusReply reply;
  impl_->set_auth(req.mutable_auth());
  req.set_placement(with_placement);
  grpc::ClientContext ctx;
  impl_->short_call(ctx);
  grpc::Status s = impl_->conn().stub->Status(&ctx, req, &reply);
  if (!s.ok()) impl_->fail(s, "status");
  return detail::from_proto(reply);
}

}  // namespace dtrain::rendezvous
