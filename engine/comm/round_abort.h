// The process-wide "this round is over" flag of recovery in place
// (cluster.recover_in_place): set by the worker's round watcher when its agent
// announces a new round, read by the waits that no socket can interrupt (the
// shared-memory groups' futex waits); end_round also shuts down the
// process's TCP connections, which is how Gloo's ops leave (c10d's Gloo has
// no abort).
#pragma once

#include <cstdint>
#include <functional>

namespace dtrain::engine::comm {

// Marks the round as over: every shared-memory wait throws within its
// sleep slice, every live RoundEndAbort is called, and TrainSession leaks
// its groups instead of destroying them.
void abort_round();
bool round_aborted();

// Whether an object destroyed now must not wait for the round's pending
// collective work: the round was aborted, or an exception is unwinding its
// owner (a collective failed before the agent's notice came, e.g. a peer's
// connection reset when a cut link returned). Either way another op of the
// same groups may wait on a pair the cut left half open, for the group's
// timeout, and c10d's ProcessGroupGloo destructor joins the thread that
// waits: a worker kept in place once sat there past the start-up bound.
bool leaving_round();
// The next round's groups start clean: clears the flag, counts the round.
void clear_round_abort();
// How many rounds this process trained before the current one (0 in a
// process that never recovered in place): what caches of the world key on.
int round_generation();
// Throws dtrain::Error(worker_failed) naming `where` when the round is over.
void throw_if_round_aborted(const char* where);

// End the round this process is in, from any thread: abort_round(), then
// shutdown(SHUT_RDWR) on every connected TCP socket of the process, so a
// Gloo op waiting on a peer throws at once (and the peer's, on its side of
// the connection). Listening sockets stay (a new round uses new ports).
// SIGPIPE is ignored from then on, so a write on a shut socket throws
// instead of killing the process. Returns how many sockets it shut down.
int end_round();

// A blocking wait that no socket's shutdown ends (a Gloo send or recv waits
// on its buffer's condition variable, up to the group's timeout, 300 s by
// default: seen in a memory copy's send to a node that was gone): while one
// of these is alive, abort_round() (and so end_round()) calls its `abort`
// (from the watcher's thread), which wakes the wait (c10d's
// SendWork/RecvWork::abort).
class RoundEndAbort {
 public:
  explicit RoundEndAbort(std::function<void()> abort);
  ~RoundEndAbort();
  RoundEndAbort(const RoundEndAbort&) = delete;
  RoundEndAbort& operator=(const RoundEndAbort&) = delete;

 private:
  uint64_t id_;
};

}  // namespace dtrain::engine::comm
