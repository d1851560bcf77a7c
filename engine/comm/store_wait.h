// Waiting for rank 0's TCPStore to listen before c10d's client connects to
// it. c10d's client, refused, sleeps its connect backoff (500 ms +- 50%,
// growing) before it tries again, so a worker that reaches init_comm before
// rank 0 has started its store (every start, restart and round change where
// rank 0 is not first) lost a quarter to three quarters of a second there.
// A plain TCP connect every 10 ms sees the listener within 10 ms of its start.
#pragma once

#include <chrono>
#include <string>

namespace dtrain::engine::comm::detail {

// True once a TCP connection to host:port is accepted (it is closed at
// once: the store's server drops a client that sends nothing). False when
// `until` passes first, when the round is aborted (round_abort.h), or when
// host does not resolve: the caller's own connect then says why.
bool wait_for_listener(const std::string& host, int port, std::chrono::steady_clock::time_point until);

}  // namespace dtrain::engine::comm::detail
