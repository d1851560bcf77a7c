// The bench's simulated agents (rendezvous_scale_agents.h). The thread mode
// costs one OS thread per agent: 16384 agents on 2 cores spent most of the
// machine in the clients. The async mode drives the same calls (one channel,
// one TLS connection, one Join per agent) from a CompletionQueue and 2
// threads, so the clients cost little beside the server.
#include "bench/rendezvous_scale_agents.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <semaphore>
#include <thread>

#include "common/error.h"
#include "rendezvous/grpc_options.h"
#include "rendezvous/rendezvous.grpc.pb.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/rendezvous_proto.h"

namespace dtrain::bench {

using namespace dtrain::rendezvous;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

constexpr double kCallTimeoutS = 300.0;  // 16384 handshakes queue at one server

JoinInfo agent_info(int i, int slots) {
  JoinInfo info;
  info.job = "bench";
  info.token = "t";
  info.node_id = "agent-" + std::to_string(i);
  info.host = "127.0.0.1";
  info.slots = slots;
  info.master_port = 29500;
  return info;
}

// Blocks until `counter` reaches `target` (futex waits, no polling).
void wait_for(std::atomic<int>& counter, int target) {
  for (int v = counter.load(); v < target; v = counter.load()) counter.wait(v);
}

void bump(std::atomic<int>& counter) {
  counter.fetch_add(1);
  counter.notify_all();
}

}  // namespace

int run_agents_threads(const AgentsRun& run, std::vector<AgentRecord>& out) {
  out.assign(static_cast<size_t>(run.count), {});
  std::atomic<int> failures{0}, ready{0}, finished{0};
  // The start gate is a futex (atomic wait), not a condition variable:
  // waking 4096 waiters of one mutex serialises them on it, which spread the
  // joins over up to a second on 2 cores.
  std::atomic<bool> go{false}, release{false};
  // Preconnect: at most 32 handshakes in flight per process. 16384 at once
  // overran the server: handshakes timed out before the SETTINGS frame, the
  // clients retried, and the half-open retries exhausted its descriptors.
  std::counting_semaphore<1024> connecting(std::max(1, std::min(run.window, 1024)));
  std::vector<std::thread> threads;
  for (int k = 0; k < run.count; ++k)
    threads.emplace_back([&, k] {
      const int i = run.first + k;
      ClientOptions co;
      co.endpoint = run.endpoint;
      co.job = "bench";
      co.token = "t";  // TLS identity derived from it, as agents do
      co.call_timeout_s = kCallTimeoutS;
      RendezvousClient client(co);
      if (run.preconnect) {
        connecting.acquire();
        try {
          client.status();
        } catch (const Error& e) {
          if (failures++ == 0) std::fprintf(stderr, "agent %d: status: %s\n", i, e.message().c_str());
        }
        connecting.release();
      }
      bump(ready);
      go.wait(false);
      AgentRecord& r = out[static_cast<size_t>(k)];
      r.sent_ns = steady_ns();
      try {
        Assignment a = client.join(agent_info(i, run.slots), kCallTimeoutS);
        for (const RankPlacement& p : a.local_ranks) r.ranks.push_back(p.rank);
      } catch (const Error& e) {
        if (failures++ == 0) std::fprintf(stderr, "agent %d: %s\n", i, e.message().c_str());
      }
      r.done_ns = steady_ns();
      bump(finished);
      release.wait(false);  // the connection stays up until done() has run
    });
  wait_for(ready, run.count);
  run.gate();
  go.store(true);
  go.notify_all();
  wait_for(finished, run.count);
  run.done(out);
  release.store(true);
  release.notify_all();
  for (auto& t : threads) t.join();
  return failures.load();
}

namespace {

// One async agent. Its connect and its Join complete on the queue with a
// tag that points back at it.
struct Agent;
struct Tag {
  Agent* agent;
  bool join;  // else: a connectivity change
};

struct Agent {
  int index = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Rendezvous::Stub> stub;
  pb::JoinRequest request;
  pb::JoinReply reply;
  grpc::ClientContext context;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::JoinReply>> call;
  Tag on_state{this, false}, on_join{this, true};
  bool unreachable = false;  // no connection by the deadline: never joins
};

class AsyncAgents {
 public:
  AsyncAgents(const AgentsRun& run, std::vector<AgentRecord>& out) : run_(run), out_(out) {}

  int go() {
    out_.assign(static_cast<size_t>(run_.count), {});
    rendezvous::detail::disable_mutex_deadlock_detection();  // as RendezvousClient does
    const TlsIdentity tls = token_tls_identity("t");
    auto credentials = rendezvous::detail::client_credentials(tls);
    grpc::ChannelArguments args = rendezvous::detail::client_channel_args(tls);
    // gRPC shares one connection between channels whose arguments are equal
    // (its global subchannel pool); each agent is a machine of its own.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    for (int k = 0; k < run_.count; ++k) {
      auto a = std::make_unique<Agent>();
      a->index = k;
      a->channel = grpc::CreateCustomChannel(run_.endpoint, credentials, args);
      a->stub = pb::Rendezvous::NewStub(a->channel);
      rendezvous::detail::to_proto(agent_info(run_.first + k, run_.slots), kCallTimeoutS, &a->request);
      agents_.push_back(std::move(a));
    }
    std::thread workers[2];
    for (auto& w : workers) w = std::thread([this] { serve(); });
    if (run_.preconnect) {
      start_connects();
      wait_for(connected_, run_.count);
      run_.gate();
      for (auto& a : agents_)
        if (!a->unreachable) start_join(*a);
    } else {  // the clock covers the handshakes: each agent joins once connected
      run_.gate();
      join_on_ready_ = true;
      start_connects();
    }
    wait_for(done_, run_.count);
    run_.done(out_);
    queue_.Shutdown();
    for (auto& w : workers) w.join();
    return failures_.load();
  }

 private:
  void start_connects() {
    deadline_ = std::chrono::system_clock::now() + std::chrono::seconds(static_cast<int>(kCallTimeoutS));
    for (int k = 0; k < std::max(1, run_.window); ++k) next_connect();
  }
  void next_connect() {
    const int k = next_.fetch_add(1);
    if (k >= run_.count) return;
    Agent& a = *agents_[static_cast<size_t>(k)];
    if (join_on_ready_) out_[static_cast<size_t>(k)].sent_ns = steady_ns();
    watch(a);
  }
  // Ask for a connection and wait for the channel's next state change.
  void watch(Agent& a) {
    const grpc_connectivity_state s = a.channel->GetState(true);
    if (s == GRPC_CHANNEL_READY) return ready(a);
    a.channel->NotifyOnStateChange(s, deadline_, &queue_, &a.on_state);
  }
  void ready(Agent& a) {
    if (join_on_ready_) start_join(a);
    bump(connected_);
    next_connect();
  }
  void start_join(Agent& a) {
    if (!join_on_ready_) out_[static_cast<size_t>(a.index)].sent_ns = steady_ns();
    a.context.set_deadline(deadline_ + std::chrono::seconds(static_cast<int>(detail::kJoinDeadlineGraceS)));
    a.context.set_wait_for_ready(true);
    a.call = a.stub->PrepareAsyncJoin(&a.context, a.request, &queue_);
    a.call->StartCall();
    a.call->Finish(&a.reply, &a.status, &a.on_join);
  }
  void fail(const Agent& a, const std::string& why) {
    if (failures_++ == 0) std::fprintf(stderr, "agent %d: %s\n", run_.first + a.index, why.c_str());
  }
  void joined(Agent& a) {
    AgentRecord& r = out_[static_cast<size_t>(a.index)];
    r.done_ns = steady_ns();
    if (!a.status.ok()) {
      fail(a, "join: gRPC code " + std::to_string(static_cast<int>(a.status.error_code())) + ": " +
                  a.status.error_message());
    } else {
      try {
        for (const RankPlacement& p : rendezvous::detail::from_proto(a.reply).local_ranks)
          r.ranks.push_back(p.rank);
      } catch (const Error& e) {
        fail(a, "join reply: " + e.message());
      }
    }
    bump(done_);
  }
  void serve() {
    void* tag = nullptr;
    bool ok = false;
    while (queue_.Next(&tag, &ok)) {
      Tag& t = *static_cast<Tag*>(tag);
      if (t.join) {
        joined(*t.agent);
      } else if (ok) {
        watch(*t.agent);  // not ready yet (connecting, or retrying after a failure)
      } else {  // the deadline passed before the channel was ready
        t.agent->unreachable = true;
        fail(*t.agent, "no connection within the deadline");
        out_[static_cast<size_t>(t.agent->index)].done_ns = steady_ns();
        bump(connected_);
        bump(done_);
        next_connect();
      }
    }
  }

  const AgentsRun& run_;
  std::vector<AgentRecord>& out_;
  grpc::CompletionQueue queue_;
  std::vector<std::unique_ptr<Agent>> agents_;  // destroyed before queue_
  std::chrono::system_clock::time_point deadline_;
  std::atomic<bool> join_on_ready_{false};
  std::atomic<int> next_{0}, connected_{0}, done_{0}, failures_{0};
};

}  // namespace

int run_agents_async(const AgentsRun& run, std::vector<AgentRecord>& out) {
  AsyncAgents agents(run, out);
  return agents.go();
}

}  // namespace dtrain::bench
