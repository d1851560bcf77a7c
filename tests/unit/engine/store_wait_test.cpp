// wait_for_listener (engine/comm/store_wait.h): what init_comm waits on before
// c10d's TCPStore client connects to rank 0's store.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "engine/comm/round_abort.h"
#include "engine/comm/store_wait.h"

namespace {

using Clock = std::chrono::steady_clock;
using dtrain::engine::comm::detail::wait_for_listener;

// A bound, not yet listening, socket on a free loopback port.
int bound_socket(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  *port = ntohs(a.sin_port);
  return fd;
}

}  // namespace

TEST_CASE("store wait: a listener that starts late is found; none by the deadline is not") {
  int port = 0;
  const int fd = bound_socket(&port);
  // Nothing listens (bound only: connects are refused): false at the deadline.
  CHECK_FALSE(wait_for_listener("127.0.0.1", port, Clock::now() + std::chrono::milliseconds(150)));
  // The listener starts while the wait goes on: true, and the connection it
  // made is the one waiting in the backlog.
  std::thread late([fd] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::listen(fd, 4);
  });
  const bool up = wait_for_listener("127.0.0.1", port, Clock::now() + std::chrono::seconds(20));
  late.join();
  CHECK(up);
  const int accepted = ::accept(fd, nullptr, nullptr);
  CHECK(accepted >= 0);
  if (accepted >= 0) ::close(accepted);
  // A round that is over stops the wait at once.
  dtrain::engine::comm::abort_round();
  int other = 0;
  const int fd2 = bound_socket(&other);
  const auto t0 = Clock::now();
  CHECK_FALSE(wait_for_listener("127.0.0.1", other, t0 + std::chrono::seconds(20)));
  CHECK(Clock::now() - t0 < std::chrono::seconds(10));  // not the 20-s deadline
  dtrain::engine::comm::clear_round_abort();
  ::close(fd);
  ::close(fd2);
}
