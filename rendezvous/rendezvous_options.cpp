// server_options_from_spec (rendezvous_server.h): the one mapping from a job
// spec to the rendezvous server's options. No gRPC here.
#include <algorithm>

#include "common/job_spec.h"
#include "rendezvous/rendezvous_server.h"

namespace dtrain::rendezvous {

ServerOptions server_options_from_spec(const JobSpec& spec, std::string token, bool allow_slow) {
  ServerOptions o;
  o.job = spec.job.name;
  o.token = std::move(token);
  o.tls = tls_identity_from_spec(spec.cluster.rendezvous);
  o.min_nodes = spec.cluster.nodes_min;
  o.max_nodes = spec.cluster.nodes_max;
  o.last_call_s = spec.cluster.rendezvous.last_call_s;
  o.heartbeat_s = spec.cluster.rendezvous.heartbeat_s;
  o.hang_timeout_s = spec.cluster.hang_timeout_s;
  o.hang_timeout_steps = spec.cluster.hang_timeout_steps;
  // Start-up (process, LibTorch, connecting the groups) is bounded as an
  // agent's wait for a round is: as long, and never below the hang timeout.
  o.startup_timeout_s = std::max(double(spec.cluster.rendezvous.join_timeout_s), spec.cluster.hang_timeout_s);
  o.mesh = spec.mesh();
  o.traffic = traffic_model_from_spec(spec);
  o.nvlink_domain = spec.cluster.topology.nvlink_domain;
  o.allow_slow = allow_slow;
  o.grad_accum_auto = spec.train.grad_accum_auto;
  o.global_batch = spec.train.global_batch;
  o.micro_batch = spec.train.micro_batch;
  o.grad_accum = spec.train.grad_accum;
  return o;
}

}  // namespace dtrain::rendezvous
