// The gRPC rendezvous server (docs/ARCHITECTURE.md, 'Rendezvous'): rounds, placement
// on close, heartbeats, failures. Embedded in `dtrain launch` or standalone.
#pragma once

#include <memory>
#include <string>

#include "rendezvous/rendezvous_types.h"
#include "rendezvous/tls.h"
#include "rendezvous/topology.h"

namespace dtrain::rendezvous {

struct ServerOptions {
  std::string job = "dtrain";
  std::string token;              // required match; compared in constant time
  TlsIdentity tls;                // empty: derived from the token (tls.h)
  int min_nodes = 1;
  int max_nodes = 1;
  double last_call_s = 5.0;       // elastic: close at min after this long
  double heartbeat_s = 2.0;       // agents beat this often; 3 misses = dead
  double hang_timeout_s = 0;      // no rank completes a collective this long = hang (0 = off)
  double hang_timeout_steps = 0;  // > 0: ... or this many of the slowest step (round_hang.cpp)
  // With hang_timeout_s on: a rank that has completed no collective this long
  // after its round closed hangs in start-up (0 = no bound).
  double startup_timeout_s = 0;
  mesh::Mesh mesh;
  TrafficModel traffic;
  int nvlink_domain = 0;          // for islands when agents report none
  bool allow_slow = false;
  // train.global_batch > 0: a round whose dp cannot keep it is refused when
  // it forms (with grad_accum auto: global_batch / (micro_batch x dp) does
  // not divide; else micro_batch x grad_accum x dp differs).
  bool grad_accum_auto = false;
  int global_batch = 0;
  int micro_batch = 1;
  int grad_accum = 1;
};

// Added: the options a spec implies (job name, nodes min:max, last call,
// heartbeat, mesh, traffic model, nvlink_domain, TLS files read), so `dtrain
// rendezvous` and the server embedded in `dtrain launch` are configured
// alike. The token is passed in (rendezvous/token.h reads it); it never lives
// in the spec.
ServerOptions server_options_from_spec(const JobSpec& spec, std::string token,
                                       bool allow_slow = false);

class RendezvousServer {
 public:
  explicit RendezvousServer(ServerOptions options);
  ~RendezvousServer();  // shuts down
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // Bind "host:port" (port 0 = any) and serve over TLS on background
  // threads. Returns the bound port. Throws dtrain::Error(rendezvous) when
  // it cannot bind (port in use, or host not an address of this machine).
  int start(const std::string& address);
  void shutdown();
  void wait();  // block until shutdown (standalone `dtrain rendezvous`)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::rendezvous
