// The gRPC channel and server settings of the rendezvous, in one place, so
// that client and server agree (a client that pings more often than the
// server permits gets GOAWAY "too_many_pings"). Internal: included by .cpp only.
#pragma once

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <string>

#include "rendezvous/tls.h"

namespace dtrain::rendezvous::detail {

// Client: ping an idle connection every 20 s (also while a Join long-poll
// waits, so NATs and proxies keep it), give up after 10 s without an answer.
constexpr int kKeepaliveTimeMs = 20000;
constexpr int kKeepaliveTimeoutMs = 10000;
// Server: accept pings down to every 10 s (half the client's period, so
// timer jitter never counts as a strike), and ping idle clients every 30 s.
constexpr int kServerMinPingIntervalMs = 10000;
constexpr int kServerKeepaliveTimeMs = 30000;
// Replies carry the whole placement: allow 64 MiB (8192 ranks need ~1 MiB).
constexpr int kMaxMessageBytes = 64 << 20;
// Join: the server answers a timed-out join itself ("joined K of M") at
// timeout_s; the client's gRPC deadline is this much later.
constexpr double kJoinDeadlineGraceS = 2.0;
// Heartbeat: the server holds a beat that asks to wait at most this long.
constexpr double kMaxHeartbeatWaitS = 30.0;

// Abseil built without NDEBUG (Debian's, which gRPC uses here) records the
// order of every Mutex acquisition in one global graph to detect possible
// deadlocks; gRPC holds several mutexes per call and per connection, so the
// graph and its cost grow with the number of agents (half of the time of
// 4096 joins in bench/rendezvous_scale_bench). A debugging aid, off in
// release builds of Abseil: turned off for the whole process (idempotent).
inline void disable_mutex_deadlock_detection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

// TLS always: the token travels only inside it. `tls` is never derived()
// here (the caller resolved it).
inline std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsIdentity& tls) {
  grpc::SslServerCredentialsOptions o(
      tls.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                 : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (tls.mutual) o.pem_root_certs = tls.ca;
  o.pem_key_cert_pairs.push_back({tls.key, tls.cert});
  return grpc::SslServerCredentials(o);
}

inline std::shared_ptr<grpc::ChannelCredentials> client_credentials(const TlsIdentity& tls) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = tls.ca;  // never empty: the system's roots are not trusted
  if (tls.mutual) {
    o.pem_private_key = tls.key;
    o.pem_cert_chain = tls.cert;
  }
  return grpc::SslCredentials(o);
}

inline grpc::ChannelArguments client_channel_args(const TlsIdentity& tls) {
  grpc::ChannelArguments args;
  // A token-derived certificate names kTokenCertName, not a host.
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // long-polls send no data
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  // No bandwidth-delay probing (as the server): each probe is a ping the
  // server reads and answers, per reply.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return args;
}

inline void apply_server_options(grpc::ServerBuilder& builder) {
  // gRPC sets SO_REUSEPORT by default: a second server on the same port would
  // bind too and take half of the agents. One server per port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kServerKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kServerMinPingIntervalMs);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);  // 0 = never GOAWAY
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // No server-side timer per call for the client's deadline: the server ends
  // a waiting Join or held beat itself (the request's timeout_s / wait_s),
  // and a client whose deadline passes cancels its call (OnCancel). Debian's
  // gRPC (built without NDEBUG) checks every timer it arms against a global
  // table of 1009 chained buckets; with 16384 joins waiting that walk was a
  // quarter of the server's CPU time.
  builder.AddChannelArgument(GRPC_ARG_ENABLE_DEADLINE_CHECKS, 0);
  // No bandwidth-delay probing: the messages are small, and each probe is a
  // ping, its ack and a timer per connection.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
}

}  // namespace dtrain::rendezvous::detail
