// RendezvousServer: the gRPC side of the rendezvous. A callback service, so a
// waiting Join long-poll holds no thread (1024 agents wait on a handful of
// gRPC threads); the round logic itself is RoundState (round_state.h), run
// under one mutex. A ticker thread drives time: last call, heartbeat deaths,
// join timeouts. Heartbeats that ask to wait are held (held_beats.h) and
// answered as soon as the round moves on.
#include "rendezvous/rendezvous_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/port_owner.h"
#include "rendezvous/grpc_options.h"
#include "rendezvous/held_beats.h"
#include "rendezvous/rendezvous.grpc.pb.h"
#include "rendezvous/rendezvous_proto.h"
#include "rendezvous/round_state.h"

namespace dtrain::rendezvous {
namespace {

grpc::Status to_status(const Refusal& r) {
  switch (r.kind) {
    case RefusalKind::none: return grpc::Status::OK;
    case RefusalKind::permission: return {grpc::StatusCode::PERMISSION_DENIED, r.message};
    case RefusalKind::invalid: return {grpc::StatusCode::INVALID_ARGUMENT, r.message};
    case RefusalKind::exists: return {grpc::StatusCode::ALREADY_EXISTS, r.message};
    case RefusalKind::exhausted: return {grpc::StatusCode::RESOURCE_EXHAUSTED, r.message};
    case RefusalKind::precondition: return {grpc::StatusCode::FAILED_PRECONDITION, r.message};
    case RefusalKind::deadline: return {grpc::StatusCode::DEADLINE_EXCEEDED, r.message};
  }
  return {grpc::StatusCode::INTERNAL, r.message};
}

// True when `host` (a name or numeric address) can be bound on this machine:
// a port-0 bind to its first address succeeds.
bool is_local_address(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  std::string h = host.size() > 1 && host.front() == '[' ? host.substr(1, host.size() - 2) : host;
  if (getaddrinfo(h.c_str(), "0", &hints, &res) != 0 || !res) return false;
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0;
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return ok;
}

}  // namespace

struct RendezvousServer::Impl final : public pb::Rendezvous::CallbackService {
  class JoinReactor;
  class BeatReactor;
  using Decided = std::vector<std::pair<JoinReactor*, JoinOutcome>>;
  using Beats = std::vector<HeldBeats<BeatReactor*>::Beat>;

  explicit Impl(ServerOptions options)
      : heartbeat_s(options.heartbeat_s),
        tls(options.tls.derived() ? token_tls_identity(options.token) : options.tls),
        state(options) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const pb::JoinRequest* req,
                                 pb::JoinReply* reply) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const pb::HeartbeatRequest* req,
                                      pb::HeartbeatReply* reply) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const pb::LeaveRequest* req,
                                  pb::LeaveReply* reply) override;
  grpc::ServerUnaryReactor* ReportFailure(grpc::CallbackServerContext* ctx,
                                          const pb::FailureRequest* req,
                                          pb::FailureReply* reply) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const pb::StatusRequest* req,
                                   pb::StatusReply* reply) override;

  // Under mu: pair each decided outcome with its waiting call.
  Decided take(std::vector<JoinOutcome> outcomes);
  static void finish(Decided decided);
  void cancel(uint64_t ticket);
  // Under mu, after anything that may move the round on (and every tick):
  // the held beats to answer now. answer_beats() runs outside mu.
  std::vector<std::pair<BeatReactor*, HeartbeatReply>> due_beats(TimePoint now);
  static void answer_beats(std::vector<std::pair<BeatReactor*, HeartbeatReply>> beats);
  void cancel_beat(uint64_t ticket);
  void tick_loop();
  void stop();

  double heartbeat_s;
  TlsIdentity tls;
  std::mutex mu;
  std::condition_variable cv;
  RoundState state;
  std::map<uint64_t, JoinReactor*> pending;
  HeldBeats<BeatReactor*> held;  // tickets from next_ticket too
  std::shared_ptr<const ClosedRound> placement_of;  // whose placement full_placement holds
  std::string full_placement;
  uint64_t next_ticket = 1;
  bool started = false, stopping = false, stopped = false;
  std::thread ticker;
  std::unique_ptr<grpc::Server> server;  // destroyed before the service base
};

// One waiting Join. Finished exactly once: by whoever removes it from
// `pending` (round close, timeout, shutdown) or by OnCancel if it is still
// there. Deletes itself when gRPC is done with it.
class RendezvousServer::Impl::JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  JoinReactor(Impl* impl, pb::JoinReply* reply) : impl_(impl), reply_(reply) {}
  void OnCancel() override { impl_->cancel(ticket_); }
  void OnDone() override { delete this; }
  void set_ticket(uint64_t t) { ticket_ = t; }
  // placement: the round's serialized placement (rendezvous_proto.h).
  void answer(const JoinOutcome& outcome, const std::string& placement) {
    if (outcome.refusal || !outcome.closed) {
      Finish(to_status(outcome.refusal));
      return;
    }
    detail::to_proto(*outcome.closed, outcome.node_rank, placement, reply_);
    Finish(grpc::Status::OK);
  }

 private:
  Impl* impl_;
  pb::JoinReply* reply_;
  uint64_t ticket_ = 0;
};

// One heartbeat, answered at once or held until the round moves on or its
// wait ends. Finished exactly once: by whoever takes it out of `held`, or by
// OnCancel if it is still there.
class RendezvousServer::Impl::BeatReactor final : public grpc::ServerUnaryReactor {
 public:
  BeatReactor(Impl* impl, pb::HeartbeatReply* reply) : impl_(impl), reply_(reply) {}
  void OnCancel() override {
    if (ticket_) impl_->cancel_beat(ticket_);
  }
  void OnDone() override { delete this; }
  void set_ticket(uint64_t t) { ticket_ = t; }
  void answer(const HeartbeatReply& hb) {
    reply_->set_known(hb.known);
    reply_->set_current_round(hb.current_round);
    reply_->set_failure(hb.failure);
    Finish(grpc::Status::OK);
  }

 private:
  Impl* impl_;
  pb::HeartbeatReply* reply_;
  uint64_t ticket_ = 0;
};

std::vector<std::pair<RendezvousServer::Impl::BeatReactor*, HeartbeatReply>>
RendezvousServer::Impl::due_beats(TimePoint now) {
  std::vector<std::pair<BeatReactor*, HeartbeatReply>> out;
  for (auto& beat : held.due(state.round(), now)) out.emplace_back(beat.handle, state.news(beat.node_id));
  return out;
}

void RendezvousServer::Impl::answer_beats(std::vector<std::pair<BeatReactor*, HeartbeatReply>> beats) {
  for (auto& [reactor, hb] : beats) reactor->answer(hb);
}

void RendezvousServer::Impl::cancel_beat(uint64_t ticket) {
  BeatReactor* reactor = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!held.drop(ticket, &reactor)) return;  // answered already
  }
  reactor->Finish(grpc::Status::CANCELLED);
}

RendezvousServer::Impl::Decided RendezvousServer::Impl::take(std::vector<JoinOutcome> outcomes) {
  Decided decided;
  for (auto& o : outcomes) {
    auto it = pending.find(o.ticket);
    if (it == pending.end()) continue;  // already cancelled
    decided.emplace_back(it->second, std::move(o));
    pending.erase(it);
  }
  return decided;
}

// Outside mu. Each reply carries its node's part of the placement, cut out
// through an index built once per closed round: the replies of a round cost
// O(world) together, not O(world) each.
void RendezvousServer::Impl::finish(Decided decided) {
  const ClosedRound* indexed_for = nullptr;
  std::unique_ptr<detail::PlacementIndex> index;
  for (auto& [reactor, outcome] : decided) {
    if (!outcome.closed) {
      reactor->answer(outcome, "");
      continue;
    }
    if (outcome.closed.get() != indexed_for) {
      indexed_for = outcome.closed.get();
      index = std::make_unique<detail::PlacementIndex>(outcome.closed->placement);
    }
    reactor->answer(outcome, detail::node_placement_bytes(outcome.closed->placement, *index,
                                                          outcome.node_rank));
  }
}

grpc::ServerUnaryReactor* RendezvousServer::Impl::Join(grpc::CallbackServerContext* /*ctx*/,
                                                       const pb::JoinRequest* req,
                                                       pb::JoinReply* reply) {
  auto* reactor = new JoinReactor(this, reply);
  Decided decided;
  std::vector<std::pair<BeatReactor*, HeartbeatReply>> beats;
  Refusal refusal;
  {
    std::lock_guard<std::mutex> lock(mu);
    TimePoint now = Clock::now();
    TimePoint expiry = TimePoint::max();
    if (req->timeout_s() > 0)
      expiry = now + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(req->timeout_s()));
    refusal = state.check_auth(req->auth().job(), req->auth().token());
    if (!refusal && stopping)
      refusal = {RefusalKind::precondition, "the rendezvous server is shutting down"};
    if (!refusal) {
      uint64_t ticket = next_ticket++;
      refusal = state.join(detail::from_proto(*req), ticket, now, expiry);
      if (!refusal) {
        reactor->set_ticket(ticket);
        pending[ticket] = reactor;
        decided = take(state.poll(now));
      }
    }
    beats = due_beats(now);  // a join may open the next round
  }
  if (refusal) {
    DTRAIN_WARN("rendezvous: refused join of '{}' ({}): {}", req->node_id(), req->host(),
                refusal.message);
    reactor->Finish(to_status(refusal));
  }
  finish(std::move(decided));
  answer_beats(std::move(beats));
  return reactor;
}

void RendezvousServer::Impl::cancel(uint64_t ticket) {
  JoinReactor* reactor = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = pending.find(ticket);
    if (it == pending.end()) return;  // answered already
    reactor = it->second;
    pending.erase(it);
    state.withdraw(ticket);
  }
  reactor->Finish(grpc::Status::CANCELLED);
}

grpc::ServerUnaryReactor* RendezvousServer::Impl::Heartbeat(grpc::CallbackServerContext* /*ctx*/,
                                                            const pb::HeartbeatRequest* req,
                                                            pb::HeartbeatReply* reply) {
  auto* reactor = new BeatReactor(this, reply);
  HeartbeatReply hb;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (Refusal r = state.check_auth(req->auth().job(), req->auth().token())) {
      reactor->Finish(to_status(r));
      return reactor;
    }
    std::vector<trace::RankProgress> ranks;
    ranks.reserve(static_cast<size_t>(req->ranks_size()));
    for (const auto& p : req->ranks()) ranks.push_back(detail::from_proto(p));
    const TimePoint now = Clock::now();
    hb = state.heartbeat(req->node_id(), req->round(), now, ranks);
    // No news yet: hold the reply (its beat is recorded: the node is alive).
    if (req->wait_s() > 0 && hb.known && hb.current_round == req->round() && !stopping) {
      const double wait = std::min(req->wait_s(), detail::kMaxHeartbeatWaitS);
      const uint64_t ticket = next_ticket++;
      reactor->set_ticket(ticket);
      held.hold(ticket, reactor, req->node_id(), hb.current_round,
                now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait)));
      return reactor;
    }
  }
  reactor->answer(hb);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServer::Impl::Leave(grpc::CallbackServerContext* ctx,
                                                        const pb::LeaveRequest* req,
                                                        pb::LeaveReply* /*reply*/) {
  auto* reactor = ctx->DefaultReactor();
  std::vector<std::pair<BeatReactor*, HeartbeatReply>> beats;
  Refusal r;
  {
    std::lock_guard<std::mutex> lock(mu);
    r = state.check_auth(req->auth().job(), req->auth().token());
    if (!r) state.leave(req->node_id(), req->success());
    beats = due_beats(Clock::now());
  }
  reactor->Finish(to_status(r));
  answer_beats(std::move(beats));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServer::Impl::ReportFailure(grpc::CallbackServerContext* ctx,
                                                                const pb::FailureRequest* req,
                                                                pb::FailureReply* /*reply*/) {
  auto* reactor = ctx->DefaultReactor();
  std::vector<std::pair<BeatReactor*, HeartbeatReply>> beats;
  Refusal r;
  {
    std::lock_guard<std::mutex> lock(mu);
    r = state.check_auth(req->auth().job(), req->auth().token());
    if (!r) state.report_failure(detail::from_proto(*req));
    beats = due_beats(Clock::now());  // a failure opens the next round
  }
  reactor->Finish(to_status(r));
  answer_beats(std::move(beats));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServer::Impl::Status(grpc::CallbackServerContext* ctx,
                                                         const pb::StatusRequest* req,
                                                         pb::StatusReply* reply) {
  auto* reactor = ctx->DefaultReactor();
  std::lock_guard<std::mutex> lock(mu);
  // `dtrain status --rdzv` may not know the job's name: the token suffices.
  const std::string& job = req->auth().job().empty() ? state.job() : req->auth().job();
  Refusal r = state.check_auth(job, req->auth().token());
  if (!r) detail::to_proto(state.status(Clock::now()), reply);
  reply->set_waiting_heartbeats(static_cast<int>(held.size()));
  if (!r && req->placement()) {
    // The whole placement, serialized once per closed round.
    if (auto closed = state.last_closed()) {
      if (closed != placement_of) {
        placement_of = closed;
        full_placement = detail::placement_bytes(closed->placement);
      }
      reply->set_placement(full_placement);
    }
  }
  reactor->Finish(to_status(r));
  return reactor;
}

// Time-driven transitions. The tick is a small fraction of the heartbeat so
// death is declared within ~3 intervals, and last call closes on time.
void RendezvousServer::Impl::tick_loop() {
  auto tick = std::chrono::duration<double>(std::min(0.05, std::max(0.005, heartbeat_s / 10)));
  std::unique_lock<std::mutex> lock(mu);
  while (!stopping) {
    cv.wait_for(lock, tick);
    if (stopping) break;
    const TimePoint now = Clock::now();
    Decided decided = take(state.poll(now));
    auto beats = due_beats(now);  // a death opens the next round; waits end
    if (decided.empty() && beats.empty()) continue;
    lock.unlock();
    finish(std::move(decided));
    answer_beats(std::move(beats));
    lock.lock();
  }
}

void RendezvousServer::Impl::stop() {
  Decided waiting;
  std::vector<std::pair<BeatReactor*, HeartbeatReply>> beats;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!started || stopping) return;
    stopping = true;
    for (auto& [ticket, reactor] : pending) {
      state.withdraw(ticket);
      JoinOutcome o;
      o.refusal = {RefusalKind::precondition, "the rendezvous server is shutting down"};
      waiting.emplace_back(reactor, o);
    }
    pending.clear();
    for (auto& beat : held.take_all()) beats.emplace_back(beat.handle, state.news(beat.node_id));
  }
  cv.notify_all();
  finish(std::move(waiting));
  answer_beats(std::move(beats));
  if (ticker.joinable()) ticker.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  std::lock_guard<std::mutex> lock(mu);
  stopped = true;
  cv.notify_all();
}

RendezvousServer::RendezvousServer(ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

RendezvousServer::~RendezvousServer() { shutdown(); }

int RendezvousServer::start(const std::string& address) {
  detail::disable_mutex_deadlock_detection();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, detail::server_credentials(impl_->tls), &port);
  detail::apply_server_options(builder);
  builder.RegisterService(impl_.get());
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || port == 0) {
    const std::string wanted = address.substr(address.rfind(':') + 1);
    const std::string host = address.substr(0, address.rfind(':'));
    if (!is_local_address(host))
      throw Error(ErrorCode::rendezvous,
                  "rendezvous server cannot listen on " + address + ": " + host +
                      " is not an address of this machine",
                  "give the host the agents reach this machine at (cluster.rendezvous.endpoint "
                  "or --host)");
    const std::string owner = port_owner(std::atoi(wanted.c_str()));
    throw Error(ErrorCode::rendezvous,
                "rendezvous server cannot listen on " + address + ": port " + wanted +
                    " is in use" + (owner.empty() ? "" : " (by " + owner + ")"),
                "stop that server, or pick another port with --port (0 = any free port)");
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->started = true;
  }
  impl_->ticker = std::thread([this] { impl_->tick_loop(); });
  return port;
}

void RendezvousServer::shutdown() { impl_->stop(); }

void RendezvousServer::wait() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->stopped || !impl_->started; });
}

}  // namespace dtrain::rendezvous
