// A Gloo group over the world on a process group of its own, for work that
// runs on a thread beside the training thread (the checkpoint writers): no
// op of that thread can interleave with the training thread's on a shared
// pg. No shared-memory path and no collective trace (the trace follows the
// training thread's steps). Made from an existing Comm's store and Gloo device.
#pragma once

#include <memory>
#include <string>

#include "engine/comm/comm.h"

namespace dtrain::engine::comm {

// Collective over the world: every rank calls it at the same point, with
// the same `name` (its store keys live under "pg/side/<name>"). The group
// must be destroyed before `comm`.
std::unique_ptr<Group> make_side_group(Comm& comm, const std::string& name);

}  // namespace dtrain::engine::comm
