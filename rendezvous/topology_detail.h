// Internals shared by the topology*.cpp files (not part of the API): the flat
// list of physical device slots with dense island ids, and group building.
// Nothing outside rendezvous/topology*.cpp includes this.
#pragma once

#include <string>
#include <vector>

#include "rendezvous/topology.h"

namespace dtrain::rendezvous::detail {

struct Slot {
  int node = 0;
  int device = 0;
  int island = 0;  // dense id; a CPU node (or a GPU node without islands) is one island
  bool gpu = false;
};

// Every device of the cluster, node by node; throws on inconsistent islands.
std::vector<Slot> cluster_slots(const Cluster& cluster);
std::vector<int> island_sizes(const std::vector<Slot>& slots);  // by dense island id
// The link between two devices, by the rules of a group's tier.
LinkTier link_between(const Slot& a, const Slot& b);
std::string join_ints(const std::vector<int>& v, const std::string& sep);

// Every group of every axis (tp, dp, pp, then ep when ep > 1), with its tier
// and bytes per step. slot_of_rank maps global rank -> index into slots.
std::vector<Group> build_groups(const Placement& placement, const std::vector<Slot>& slots,
                                const std::vector<int>& slot_of_rank, const TrafficModel& traffic);

}  // namespace dtrain::rendezvous::detail
