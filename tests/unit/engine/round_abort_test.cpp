// engine/comm/round_abort.h on ranks as threads of this process: a Gloo
// all-reduce waiting for a peer leaves once end_round() shuts the process's
// TCP connections (c10d's Gloo has no abort), a shared-memory wait leaves on
// the abort flag alone, and a new world then works in the same process, as
// a worker recovering in place builds its next round's groups. The old
// round's groups are leaked, as the trainer leaks them.
#include <ATen/ops/ones.h>

#include <atomic>
#include <functional>
#include <chrono>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/checkpoint/checkpoint.h"
#include "engine/comm/comm.h"
#include "engine/comm/round_abort.h"
#include "common/error.h"

#include "tests/support/thread_world.h"
#include "tests/support/torch_doctest.h"
// After torch_doctest.h: doctest's CHECK, not glog's.
#include "tests/support/skip.h"

namespace comm = dtrain::engine::comm;

namespace {

// Rank r of a world of 2 (dp=2) over `store`; timeout_s: what a wait would
// take without the abort.
std::unique_ptr<comm::Comm> rank_of_two(int r, const c10::intrusive_ptr<c10d::HashStore>& store, bool shm,
                                        double timeout_s = 30) {
  comm::WorldInfo info;
  info.rank = r;
  info.world = 2;
  info.mesh = comm::parse_mesh("dp=2");
  info.coord = dtrain::mesh::coord_of(info.mesh, r);
  comm::CommOptions options;
  options.shm = shm;
  options.timeout_s = timeout_s;
  return comm::init_comm_with_store(info, store, options);
}

// Runs body(rank, comm) on the 2 ranks of a world as threads; each rank's
// error ("" = none). The Comms are leaked (sockets shut under them), as
// TrainSession leaks them after a round abort.
std::vector<std::string> on_two_ranks(bool shm, const std::function<void(int, comm::Comm&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<comm::Comm> c;
      try {
        c = rank_of_two(r, store, shm);
        body(r, *c);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
      (void)c.release();
    });
  for (auto& t : threads) t.join();
  comm::clear_round_abort();
  return errors;
}

// World 2: rank 0 all-reduces while rank 1, instead of joining it, ends the
// round (end_round(), or only the flag) once rank 0 waits, and returns. Each
// rank's error ("" = none); *shut: the sockets end_round() shut.
std::vector<std::string> abandoned_all_reduce(bool shm, bool sockets, int* shut = nullptr) {
  std::atomic<bool> ready{false};
  return on_two_ranks(shm, [&](int r, comm::Comm& c) {
    at::Tensor t = at::ones({1024});
    if (r == 0) {
      ready = true;
      c.world().all_reduce(t);
    } else {
      while (!ready) std::this_thread::yield();
      // Rank 0 is in its wait (not still entering the op, where it would
      // meet shut sockets or the flag first).
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      if (sockets) {
        const int n = comm::end_round();
        if (shut) *shut = n;
      } else {
        comm::abort_round();
      }
    }
  });
}

// World 2 over Gloo's TCP: rank 0 waits in a recv from rank 1 (or a send to
// it, of a tensor larger than the socket buffers), and rank 1, instead of
// the matching op, sets the round's flag only (no socket is shut). Rank 0's
// error and how long its wait took, in seconds.
std::pair<std::string, double> abandoned_p2p(bool send) {
  double waited = -1;
  std::atomic<bool> ready{false};
  const auto errors = on_two_ranks(/*shm=*/false, [&](int r, comm::Comm& c) {
    if (r == 0) {
      at::Tensor t = at::ones({send ? 64 << 20 : 1024});  // 256 MB: more than the sockets hold
      ready = true;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        (send ? c.world().send(t, 1) : c.world().recv(t, 1))->wait();
      } catch (...) {
        waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        throw;
      }
      waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      while (!ready) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 is in its wait
      comm::abort_round();
    }
  });
  return {errors[0], waited};
}

// The next round: a fresh world of 2 in this process sums correctly.
void next_round_works() {
  dtrain::testing::run_world(
      comm::parse_mesh("dp=2"),
      [](comm::Comm& c, int) {
        at::Tensor t = at::ones({8});
        c.world().all_reduce(t);
        CHECK(t.sum().item<float>() == 16.0f);
      },
      [](comm::WorldInfo&, comm::CommOptions& o) { o.shm = false; });
}

}  // namespace

TEST_CASE("round abort: a Gloo all-reduce waiting for a peer leaves when end_round shuts the sockets") {
  int shut = 0;
  const auto errors = abandoned_all_reduce(/*shm=*/false, /*sockets=*/true, &shut);
  MESSAGE("rank 0 (waiting in the all-reduce): " << errors[0] << "; sockets shut: " << shut);
  // Left through its connection (Gloo: "Connection closed by peer"), not after
  // options.timeout_s. end_round() raises the flag before it shuts the
  // sockets, so rank 0's next look at the flag (every 50 ms) may come first:
  // then rank 0's Gloo pair may be closed before end_round() scans the
  // process's sockets (a CI run counted 1), and only the flag is checked.
  const bool by_flag = errors[0].find("all_reduce left: the agent announced a new round") != std::string::npos;
  CHECK((errors[0].find("Connection closed") != std::string::npos || by_flag));
  // Shut by end_round(): both ranks' ends of their pair, at least.
  if (!by_flag) CHECK(shut >= 2);
  CHECK(errors[1].empty());
  next_round_works();
}

// A Gloo op that no shut socket reaches (a send already handed to its pair
// can wait in UnboundBuffer::waitSend for good): it leaves on the flag alone,
// not after options.timeout_s (30 s).
TEST_CASE("round abort: a Gloo all-reduce waiting for a peer leaves on the flag alone") {
  const auto errors = abandoned_all_reduce(/*shm=*/false, /*sockets=*/false);
  MESSAGE("rank 0 (waiting in the all-reduce): " << errors[0]);
  CHECK(errors[0].find("all_reduce left: the agent announced a new round") != std::string::npos);
  CHECK(errors[1].empty());
  next_round_works();
}

// A Gloo send or recv has no future to wait on, and no shut socket wakes
// its wait (seen: a memory copy's send to a node that was gone waited the
// group's 300 s): the round's flag aborts it (c10d's SendWork/RecvWork::abort).
TEST_CASE("round abort: a Gloo recv or send waiting for a peer leaves on the flag, not after the timeout") {
  for (bool send : {false, true}) {
    CAPTURE(send);
    const auto [error, waited] = abandoned_p2p(send);
    MESSAGE((send ? "send" : "recv") << " waited " << waited << " s (the group's timeout: 30 s): " << error);
    CHECK(error.find(std::string(send ? "send" : "recv") + " left: the agent announced a new round") !=
          std::string::npos);
    CHECK(waited < 10);
  }
  next_round_works();
}

TEST_CASE("round abort: a shared-memory all-reduce waiting for a peer leaves on the flag") {
  if (access("/dev/shm", W_OK) != 0) {
    dtrain::testing::skip_case(dtrain::testing::SkipKind::dev_shm, "/dev/shm is not writable here");
    return;
  }
  const auto errors = abandoned_all_reduce(/*shm=*/true, /*sockets=*/false);
  MESSAGE("rank 0 (waiting in the all-reduce): " << errors[0]);
  CHECK(errors[0].find("a shared-memory wait left: the agent announced a new round") != std::string::npos);
  next_round_works();
}

// A worker whose round ends while it waits for rank 0's store: c10d's client
// retries its connect for the whole timeout with no socket to shut, so
// init_comm checks the abort flag between slices of at most 1 s.
TEST_CASE("round abort: a TCPStore client waiting for a store that is not there leaves on the flag") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);  // a port nobody listens on
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  comm::WorldInfo info;
  info.rank = 1;
  info.world = 2;
  info.master_port = ntohs(addr.sin_port);
  info.mesh = dtrain::mesh::make_mesh(2, 1, 1, 1);
  info.coord = dtrain::mesh::coord_of(info.mesh, 1);
  comm::CommOptions options;
  options.timeout_s = 20;  // without the check the client would wait all of it, then fail as rendezvous
  comm::abort_round();
  std::string what = "(no error)";
  dtrain::ErrorCode code = dtrain::ErrorCode::internal;
  try {
    comm::init_comm(info, options);
  } catch (const dtrain::Error& e) {
    what = e.what();
    code = e.code();
  }
  comm::clear_round_abort();
  MESSAGE("rank 1 connecting to port " << info.master_port << " after the round ended: " << what);
  CHECK(code == dtrain::ErrorCode::worker_failed);
  CHECK(what.find("connecting to the TCPStore") != std::string::npos);
}

// The SIGTERM poll's all-reduce starts after one step and is waited after
// the next (checkpoint.h): a round that ends between the two leaves it
// failed, with the round's sockets. Each run has its own poll, so the next
// round of a worker recovering in place starts without it (a process-wide
// poll made the re-join case's grow round fail at its first step: 'all_reduce
// on group world failed: Connection closed by peer', a peer of the old round).
TEST_CASE("round abort: the SIGTERM poll a round left in flight does not reach the next round") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::atomic<bool> posted{false};
  dtrain::engine::checkpoint::PreemptionPoll old_poll;  // rank 0's in the old round
  comm::Group* old_control = nullptr;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      // 5 s bounds the old poll's wait should no shut socket reach it.
      auto c = rank_of_two(r, store, /*shm=*/false, /*timeout_s=*/5);
      if (r == 0) {  // its poll of the step before the round ended
        CHECK(!dtrain::engine::checkpoint::preemption_requested(c->control(), old_poll, /*last=*/false));
        old_control = &c->control();
        posted = true;
      } else {  // rank 1 got the notice before it posted its own
        while (!posted) std::this_thread::yield();
        comm::end_round();
      }
      (void)c.release();  // leaked, as TrainSession does
    });
  for (auto& t : threads) t.join();
  comm::clear_round_abort();  // the new round starts (RoundChannel::next)
  // What the old round left: waiting on it fails (the premise).
  std::string old_error = "(none)";
  try {
    dtrain::engine::checkpoint::preemption_requested(*old_control, old_poll, /*last=*/true);
  } catch (const std::exception& e) {
    old_error = e.what();
  }
  MESSAGE("the old round's poll, waited: " << old_error.substr(0, old_error.find('\n')));
  CHECK(old_error != "(none)");
  // The new round's polls, one per run as each session holds its own.
  dtrain::testing::run_world(
      comm::parse_mesh("dp=2"),
      [](comm::Comm& c, int) {
        dtrain::engine::checkpoint::PreemptionPoll poll;
        for (int step = 1; step <= 3; ++step)
          CHECK(!dtrain::engine::checkpoint::preemption_requested(c.control(), poll, /*last=*/step == 3));
      },
      [](comm::WorldInfo&, comm::CommOptions& o) { o.shm = false; });
}
