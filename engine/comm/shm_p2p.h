// Point-to-point messages through shared memory for the members of a Gloo
// group that share one machine: a Group decorator whose send and recv
// between ring neighbours (rank r and r +- 1 mod n: the pipeline's
// stage-to-stage messages) go through one byte ring per direction in a
// /dev/shm segment, with one copy in, one copy out and at most one futex
// wake per side, instead of Gloo's socket and its three thread wake-ups a
// message. Matching is Gloo's: a receive takes the earliest message from its
// peer with its tag, so messages under other tags may arrive first.
// Everything else (other peers, collectives) goes to the inner group. It does
// not decide which groups get it (init_comm: the pp group). Internal to
// engine/comm.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

#include "engine/comm/comm.h"
#include "engine/comm/shm_group.h"

namespace dtrain::engine::comm::detail {

// `inner` with send/recv to its ring neighbours through a segment its
// members share, set up collectively over `store` under `key` (every member
// must call it, in the same order as its other groups). Each direction's
// ring holds ring_bytes; a longer message streams through it. Returns
// `inner` itself (with a log line saying why) where the members cannot share
// a segment (different nodes): every member alike, so a pair never mixes
// paths. Size-1 groups are returned unchanged. Waits honour options.timeout_s
// and the round's abort flag (round_abort.h) as the shm collectives do.
std::unique_ptr<Group> with_shm_p2p(std::unique_ptr<Group> inner, const c10::intrusive_ptr<c10d::Store>& store,
                                    const std::string& key, const ShmOptions& options, int64_t ring_bytes);

// Whether g's send/recv go through shared memory (tests).
bool uses_shm_p2p(const Group& g);

}  // namespace dtrain::engine::comm::detail
