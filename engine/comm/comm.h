// Collectives for the engine (docs/ARCHITECTURE.md, 'The path of a job', step
// 6): the worker's view of the world from the environment contract ('The
// worker's environment'), one process group per mesh axis (PrefixStore per
// group over one TCPStore) on that axis's backend (Gloo on CPU tensors, NCCL on
// CUDA tensors; the data backend unless CommOptions.axis_backend says
// otherwise), a `control` Gloo group over the world that always exists (flags,
// small CPU reductions), and what a backend lacks or does slowly built from
// what it has (Gloo: a ring reduce-scatter, bf16 through fp32). Every byte sent
// is counted per group. Does not know about models or training.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mesh.h"

namespace c10d {
class Store;  // torch/csrc/distributed/c10d/Store.hpp (only comm/*.cpp include it)
}

namespace dtrain::engine::comm {

// Who this worker is: read from RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, DTRAIN_MESH, DTRAIN_COORD, DTRAIN_RESTART,
// DTRAIN_SPEC, DTRAIN_RUN_DIR, DTRAIN_RESUME_FROM, DTRAIN_INIT_FROM, DTRAIN_MEMORY_DIR and
// GLOO_SOCKET_IFNAME.
// Missing DTRAIN_MESH = pure data parallel.
// from_env is the engine's only reader of the environment: code below it
// takes these fields.
struct WorldInfo {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 1;
  int node_rank = 0;  // GROUP_RANK: which node agent started this rank
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  mesh::Mesh mesh;  // mesh.world() == world
  mesh::Coord coord;
  int restart = 0;
  std::string spec_path;
  std::string run_dir;
  // Checkpoint to load on the first launch (`dtrain resume` sets it); "" = none.
  std::string resume_from;
  // Weights to start from when there is nothing to resume (train.init_from,
  // resolved by the launcher to a checkpoint step dir); "" = none.
  std::string init_from;
  // Network interface for Gloo, as in PyTorch; "" = loopback when
  // MASTER_ADDR is 127.x or localhost, else the host's default.
  std::string gloo_socket_ifname;
  // DTRAIN_MEMORY_DIR: this node's directory in RAM (/dev/shm) for the
  // in-memory checkpoint copies, owned by the agent; "" = none.
  std::string memory_dir;
  // `dtrain eval`: evaluate this checkpoint instead of training
  // (DTRAIN_EVAL_CKPT, DTRAIN_EVAL_BATCHES windows, rank 0's JSON to
  // DTRAIN_EVAL_OUT); ckpt "" = train.
  struct Eval {
    std::string ckpt;
    int windows = 0;
    std::string out;
  } eval;

  static WorldInfo from_env();  // throws dtrain::Error(config) naming the variable
};

// An async operation. wait() rethrows a failure as dtrain::Error.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

enum class ReduceOp { sum, max, min };
const char* reduce_op_name(ReduceOp op);

// One process group: a set of global ranks (an axis group, or the world).
// Ops are collective over the group's members; tensors are contiguous and
// live on device() (CPU for Gloo, this rank's GPU for NCCL).
class Group {
 public:
  virtual ~Group() = default;
  virtual const std::string& name() const = 0;  // "world", "control" or a group name of common/mesh.h
  virtual const std::string& backend() const = 0;  // "gloo" | "nccl"
  // Where its all_reduce, all_gather and reduce_scatter go: "shm" (a
  // segment its members share, shm_group.h), else backend().
  virtual std::string path() const { return backend(); }
  virtual c10::Device device() const = 0;           // where this group's tensors live
  virtual int rank() const = 0;                 // index of this process in the group
  virtual int size() const = 0;
  virtual const std::vector<int>& global_ranks() const = 0;

  // Reduce in place (sum by default). Mean = sum, then divide: there is no
  // average op, so every backend adds in the same order.
  virtual WorkPtr all_reduce(at::Tensor& t, bool async = false, ReduceOp op = ReduceOp::sum) = 0;
  // out = concat of every rank's `in` along dim 0 (same shape on all ranks);
  // out has size()*in.numel() elements.
  virtual WorkPtr all_gather(const at::Tensor& in, at::Tensor& out, bool async = false) = 0;
  // in has size()*out.numel() elements: out = sum over ranks of chunk rank().
  virtual WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, bool async = false);
  virtual WorkPtr broadcast(at::Tensor& t, int root, bool async = false) = 0;
  // Uneven all-to-all along dim 0: in_splits[i] rows go to rank i,
  // out_splits[i] rows come from rank i (rows of equal size).
  virtual WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out,
                             const std::vector<int64_t>& out_splits,
                             const std::vector<int64_t>& in_splits, bool async = false);
  // Point to point, peer given as the index in this group. Always async:
  // wait() on the returned handle. Tags must be in [0, kMaxUserTag).
  virtual WorkPtr send(const at::Tensor& t, int peer, int tag = 0);
  virtual WorkPtr recv(at::Tensor& t, int peer, int tag = 0);
  // Waits for this group's pending ring operations, then a Gloo barrier.
  virtual void barrier() = 0;

  // Bytes this rank has put on the wire through this group (bf16 reductions
  // travel as fp32 and count 4 bytes an element):
  //   all_reduce      2(n-1)/n * bytes (the ring algorithm's figure; Gloo
  //                   picks its own algorithm, which we cannot observe)
  //   all_gather      (n-1) * in bytes (Gloo's ring)
  //   reduce_scatter  the actual sends of our ring: (n-1)/n * in bytes
  //   broadcast       (n-1)/n * bytes on every rank (the average over ranks
  //                   of any tree: n-1 copies of the buffer in total)
  //   all_to_all      the rows this rank sends to other ranks
  //   send            the tensor's bytes; recv and barrier count nothing
  virtual uint64_t bytes_sent() const = 0;
  virtual void reset_bytes_sent() = 0;

 protected:
  // What a backend without an op inherits for it (reduce_scatter,
  // all_to_all, send, recv): throws dtrain::Error(internal) naming the
  // backend, the op and the group.
  [[noreturn]] void unsupported(const char* op) const;
};

// The worker's process groups: the world and one group per mesh axis.
class Comm {
 public:
  virtual ~Comm() = default;
  virtual const WorldInfo& info() const = 0;
  virtual Group& world() = 0;
  // This rank's group of `kind` (common/mesh.h's group_defs). Kinds with
  // the same members share connections but count their bytes apart.
  virtual Group& group(mesh::GroupKind kind) = 0;
  // The same by name ("tp", "dp_cp", ...; tests and tools); throws
  // dtrain::Error(internal) for a name that is not a group.
  Group& axis(const std::string& name);
  // Gloo over the world, CPU tensors, whatever the data backend: the
  // preemption flag, checkpoint barriers, small CPU reductions. (With Gloo
  // as the data backend it is the world group itself.)
  virtual Group& control() = 0;
};

struct CommOptions {
  // The data backend: gloo | nccl (nccl only in CUDA builds). The world
  // group and every axis not in axis_backend use it.
  std::string backend = "gloo";
  // Per group name ("dp", "tp", "cp", "pp", "dp_cp", "ep", "edp"): a backend other than `backend`
  // for that axis's groups, e.g. {{"tp", "nccl"}} with backend gloo.
  // init_comm checks every entry (known axis, known backend, built in, on
  // the right device) and throws dtrain::Error(config) naming it.
  std::map<std::string, std::string> axis_backend;
  // NCCL: this rank's GPU (the current device). Ignored by Gloo.
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  double timeout_s = 300;
  // Gloo groups whose members are all on one node (WorldInfo::node_rank)
  // and can map one /dev/shm segment all-reduce, all-gather and
  // reduce-scatter through it (shm_group.h);
  // false: Gloo's TCP for everything.
  bool shm = true;
  int64_t shm_slot_bytes = int64_t{512} << 10;  // staged per rank per chunk (ShmOptions)
  // With shm: Gloo groups that span nodes with more than one member on some
  // node sum all-reduces hierarchically (hier_group.h); false: flat Gloo.
  bool hierarchical = true;
  // Gloo groups' reduce-scatter: false = dtrain's ring over send/recv,
  // true = Gloo's own (cluster.gloo_reduce_scatter native).
  bool gloo_native_reduce_scatter = false;
};

// True when this build has the NCCL backend (LibTorch with CUDA).
bool nccl_available();

// Largest tag + 1 for send/recv; tags above it are reserved for ring ops.
constexpr int kMaxUserTag = 1 << 24;

// Connects to the TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 hosts it) and
// builds the groups. Collective: every rank of the world must call it.
std::unique_ptr<Comm> init_comm(const WorldInfo& info, const CommOptions& options = {});

// The same over a store the caller made (tests: a HashStore or TCPStore
// shared by threads of one process). Groups live under "pg/<axis>/<index>"
// in it; it must outlive the Comm (the Comm keeps a reference).
std::unique_ptr<Comm> init_comm_with_store(const WorldInfo& info,
                                           const c10::intrusive_ptr<c10d::Store>& store,
                                           const CommOptions& options = {});

// DTRAIN_MESH text ("tp=2,cp=1,dp=2,pp=2,ep=1": axes innermost first,
// missing axes = 1) to a Mesh; throws dtrain::Error(config) naming `what`
// (the variable) on bad input.
mesh::Mesh parse_mesh(const std::string& text, const std::string& what = "DTRAIN_MESH");

}  // namespace dtrain::engine::comm
