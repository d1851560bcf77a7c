// Hierarchical all-reduce for Gloo groups that span nodes with several of
// their ranks on a node (multi-node CPU): sum inside each node through shared
// memory (shm_group.h), one Gloo all-reduce across nodes over the node
// leaders (each node's first member), then the leader's result to its node
// through shared memory. Sums only, of fp32, fp64, int32 and int64; every
// other op and dtype goes to the inner group unchanged. Not bit-identical to
// a flat Gloo all-reduce (another addition order), but deterministic: the
// same members give the same bits run after run, and every member gets the
// leader's bits. It does not decide which groups get it: init_comm does.
// Internal to engine/comm.
#pragma once

#include <memory>
#include <string>

#include "engine/comm/group_factory.h"
#include "engine/comm/shm_group.h"

namespace dtrain::engine::comm::detail {

// The node-local group, the leaders' group and the thread that runs the
// three stages in submission order; shared by groups with the same members.
struct HierLinks;

// Collective over the members of `g` (every member calls it, in the same
// order as its other groups): learns each member's node through ctx.store
// under `key`, and where the members span more than one node with more
// than one on some node, connects the node-local group (shared memory where
// it can map a segment) and, on leaders, the leaders' Gloo group. Null (on
// every member alike) where the group does not qualify.
std::shared_ptr<HierLinks> make_hier_links(const Group& g, const GroupContext& ctx,
                                           const std::string& key, const ShmOptions& shm);

// `inner` whose fp32/fp64/int sum all-reduces go through `links` (path()
// "shm+gloo"); async ones run on the links' thread.
std::unique_ptr<Group> with_hier_all_reduce(std::unique_ptr<Group> inner,
                                            std::shared_ptr<HierLinks> links);

// Whether g is a group with_hier_all_reduce made (not through decorators).
bool is_hier_group(const Group& g);

// Such a group's node-local group (shared memory where it could map a
// segment): symmetric_buffer (symmetric_buffer.h) of a hierarchical group is
// one of this group's, and its all-reduce of a range of one runs both node
// stages in place (shm_symmetric.h's symmetric_hier_all_reduce). Null where
// g is not one.
Group* hier_node_group(Group& g);

}  // namespace dtrain::engine::comm::detail
