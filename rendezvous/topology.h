// Cluster model and rank placement on the mesh (common/mesh.h)
// (docs/ARCHITECTURE.md, 'Placement'). Pure functions over plain structs: no gRPC, no
// I/O. Shared by `dtrain topo` and the live rendezvous, so both place ranks alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/mesh.h"
#include "plan/traffic.h"

namespace dtrain {
struct JobSpec;
}

namespace dtrain::rendezvous {

// Link tiers. loopback = processes on one CPU-only host; pcie = GPUs of one
// node in different NVLink islands (added after the first three; the values
// are not ordered by speed: use tier_slowness to compare).
enum class LinkTier { nvlink = 0, loopback = 1, ib = 2, pcie = 3 };
const char* link_tier_name(LinkTier tier);
// 0 = fastest: nvlink 0, loopback 1, pcie 2, ib 3.
int tier_slowness(LinkTier tier);

struct NodeInfo {
  std::string host = "localhost";
  int devices = 1;                    // GPUs, or CPU worker slots
  bool gpu = false;                   // false: CPU-only node, its links are "loopback"
  std::vector<int> island_of_device;  // global NVLink island id per local device
                                      // (same id on two nodes = island spans them, NVL72)
};

struct Cluster {
  std::vector<NodeInfo> nodes;
  int total_devices() const;
};

// nodes x devices_per_node; nvlink_domain = devices per island (0 = one island
// per node; larger than devices_per_node = islands that span consecutive nodes).
Cluster make_cluster(int nodes, int devices_per_node, int nvlink_domain, bool gpu);

// Per-step traffic inputs and bytes per axis group: the cost model's
// (plan/traffic.h); placement weighs groups by them.
using plan::TrafficModel;
using plan::traffic_model_from_spec;

struct RankPlacement {
  int rank = 0;
  int node = 0;
  int device = 0;  // local device index on its node (= LOCAL_RANK)
  mesh::Coord coord;
};

struct Group {
  std::string axis;  // a group name of common/mesh.h: "tp", "cp", "dp", "pp", "ep"
  std::vector<int> ranks;
  LinkTier tier = LinkTier::loopback;  // slowest link its traffic crosses
  uint64_t bytes_per_step = 0;
};

struct Placement {
  mesh::Mesh mesh;
  std::vector<RankPlacement> ranks;  // indexed by global rank
  std::vector<Group> groups;
  std::vector<std::string> warnings;
};

// Place mesh.world() ranks on the cluster: TP groups inside an NVLink island,
// pipeline neighbours on different nodes where the cluster allows, the
// stage's other axes (dp, cp) between; rank numbers follow mesh.order.
// Throws dtrain::Error(config) when the mesh does not fit the cluster, or when
// a TP group would cross an NVLink island (unless allow_slow: then a warning).
Placement place_ranks(const Cluster& cluster, const mesh::Mesh& mesh, const TrafficModel& traffic,
                      bool allow_slow = false);

// The spec's view of the cluster and the mesh, as `dtrain topo` and the
// rendezvous see them: cluster.nodes x cluster.procs_per_node, GPU when
// cluster.device is cuda, islands of cluster.topology.nvlink_domain devices.
// Elastic specs ("nodes: 1:4") use the node count whose devices equal the world.
Cluster cluster_from_spec(const JobSpec& spec);

// place_ranks(cluster_from_spec, spec.mesh(), traffic_model_from_spec) with
// spec_warnings (from load_job_spec) put first in the placement's warnings.
// What `dtrain topo SPEC` prints.
Placement place_job(const JobSpec& spec, bool allow_slow = false,
                    const std::vector<std::string>& spec_warnings = {});

// Renderings used by `dtrain topo`.
std::string placement_to_text(const Placement& placement, const Cluster& cluster);
std::string placement_to_json(const Placement& placement);  // schema: docs/ARCHITECTURE.md, 'Placement'
std::string placement_to_svg(const Placement& placement, const Cluster& cluster);

}  // namespace dtrain::rendezvous
