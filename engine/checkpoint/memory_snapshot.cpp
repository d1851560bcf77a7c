// The in-memory copies of memory_snapshot.h. A node's directory holds
// step_<N>.<id>/rank_<r>.safetensors (<id>: the copy's, drawn by its
// writers; a checkpoint rank file, the same bytes a
// disk save writes), rank_<r>.peer (present when that file is a copy sent by
// another node) and header.json (the index without its tensor table). Files
// appear by rename, so a reader never sees half of one. A copy is written
// and sent by a writer thread (memory_copy.cpp) over its own Gloo group; a
// restore runs on the training thread over the world's control group.
#include "engine/checkpoint/memory_snapshot.h"
#include "engine/comm/round_abort.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <system_error>
#include <tuple>

#include "common/checkpoint_index.h"
#include "common/checkpoint_writer.h"
#include "common/error.h"
#include "common/log.h"

namespace dtrain::engine::checkpoint {
namespace ck = dtrain::checkpoint;
namespace fs = std::filesystem;
namespace {

constexpr int kMaxHeld = 64;  // (step, rank) entries one rank reports at a restore
constexpr int kFields = 5;    // of each: step, copy id, old rank, old world, 1 = a copy from a peer

// A copy's directory: step_<N>.<id>, the id drawn by the writers for that
// copy. Two copies of one step number (a timeline abandoned by a restore and
// the one after it; a node cut off keeps the old one) never share a
// directory, and a restore never mixes their files.
std::string step_path(const std::string& root, int64_t step, int64_t id) {
  return root + "/step_" + std::to_string(step) + "." + std::to_string(id);
}
std::string rank_name(int64_t r) { return "rank_" + std::to_string(r) + ".safetensors"; }
std::string peer_mark(int64_t r) { return "rank_" + std::to_string(r) + ".peer"; }

// step_<N>.<id> -> {N, id}; {-1, -1} for anything else.
std::pair<int64_t, int64_t> copy_of(const std::string& name) {
  const size_t dot = name.find('.');
  const auto digits = [](const std::string& x) {
    return !x.empty() && x.size() <= 18 && std::all_of(x.begin(), x.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (name.rfind("step_", 0) != 0 || dot == std::string::npos) return {-1, -1};
  const std::string step = name.substr(5, dot - 5), id = name.substr(dot + 1);
  if (!digits(step) || !digits(id)) return {-1, -1};
  return {std::stoll(step), std::stoll(id)};
}

at::Tensor read_bytes(const std::string& path) {  // [n] uint8
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(ErrorCode::checkpoint, "cannot read the in-memory copy " + path);
  const auto n = static_cast<int64_t>(in.tellg());
  at::Tensor t = at::empty({n}, at::kByte);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(t.data_ptr()), n);
  if (!in) throw Error(ErrorCode::checkpoint, "cannot read the in-memory copy " + path);
  return t;
}

// <dir>/<name> appears whole: written under a name of this rank's, then renamed.
void write_atomic(const std::string& dir, const std::string& name, const void* data, size_t n, int rank) {
  const std::string tmp = dir + "/." + name + ".tmp" + std::to_string(rank);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    if (!out) throw Error(ErrorCode::checkpoint, "cannot write the in-memory copy " + tmp,
                          "is /dev/shm full? free memory or lower checkpoint.memory.replicas");
  }
  fs::rename(tmp, dir + "/" + name);
}

// Which node (GROUP_RANK) and local index every rank of this process's
// world has: gathered once per world. A worker that recovers in place
// (cluster.recover_in_place) trains several worlds in one process, one
// per round generation (engine/comm/round_abort.h).
struct Layout {
  int generation = -1;           // comm::round_generation() it was gathered in
  std::vector<int> node, local;  // by global rank
  std::vector<int> nodes;        // distinct, ascending
};

const Layout& layout(const TrainState& s) {
  static Layout l;
  if (l.generation == comm::round_generation()) return l;
  l = Layout{};
  l.generation = comm::round_generation();
  const int world = s.info->world;
  at::Tensor mine = at::empty({2}, at::kLong);  // [node, local]
  mine.data_ptr<int64_t>()[0] = s.info->node_rank;
  mine.data_ptr<int64_t>()[1] = s.info->local_rank;
  at::Tensor all = at::empty({2 * world}, at::kLong);
  s.control->all_gather(mine, all);
  for (int r = 0; r < world; ++r) {
    l.node.push_back(int(all.data_ptr<int64_t>()[2 * r]));
    l.local.push_back(int(all.data_ptr<int64_t>()[2 * r + 1]));
  }
  l.nodes = l.node;
  std::sort(l.nodes.begin(), l.nodes.end());
  l.nodes.erase(std::unique(l.nodes.begin(), l.nodes.end()), l.nodes.end());
  return l;
}

// The rank with `rank`'s local index on the node `d` places after its own
// (d < 0: before), among the world's nodes in order; -1 when there is none.
int peer_rank(const Layout& l, int rank, int d) {
  const int n = int(l.nodes.size());
  const int i = int(std::find(l.nodes.begin(), l.nodes.end(), l.node[size_t(rank)]) - l.nodes.begin());
  const int target = l.nodes[size_t(((i + d) % n + n) % n)];
  for (size_t r = 0; r < l.node.size(); ++r)
    if (l.node[r] == target && l.local[r] == l.local[size_t(rank)]) return int(r);
  return -1;
}

// A file of the node's RAM directory mapped, so that a restore sends a held
// shard and receives a missing one without copying it in between: read-only
// (an existing file) or a new file of n bytes reserved up front (a full
// /dev/shm is an error here, not a SIGBUS on a page later).
class Mapped {
 public:
  static Mapped open_read(const std::string& path) {
    Mapped m(path, ::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (::fstat(m.fd_, &st) != 0) m.fail("cannot stat");
    m.map(size_t(st.st_size), PROT_READ);
    return m;
  }
  static Mapped create(const std::string& path, size_t n) {
    Mapped m(path, ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (n > 0) {
      const int err = ::posix_fallocate(m.fd_, 0, off_t(n));
      if (err != 0) {
        errno = err;
        m.fail("cannot reserve " + std::to_string(n) + " bytes for");
      }
    }
    m.map(n, PROT_READ | PROT_WRITE);
    return m;
  }
  Mapped(Mapped&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_), data_(o.data_), n_(o.n_) {
    o.fd_ = -1;
    o.data_ = nullptr;
  }
  Mapped& operator=(Mapped&&) = delete;
  ~Mapped() {
    if (data_ != nullptr) ::munmap(data_, n_);
    if (fd_ >= 0) ::close(fd_);
  }
  at::Tensor bytes() const {  // [n] uint8 over the mapping (empty for an empty file)
    return n_ == 0 ? at::empty({0}, at::kByte) : at::from_blob(data_, {int64_t(n_)}, at::kByte);
  }

 private:
  Mapped(std::string path, int fd) : path_(std::move(path)), fd_(fd) {
    if (fd_ < 0) fail("cannot open");
  }
  void map(size_t n, int prot) {
    n_ = n;
    if (n == 0) return;
    void* p = ::mmap(nullptr, n, prot, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) fail("cannot map");
    data_ = p;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorCode::checkpoint, what + " the in-memory copy " + path_ + ": " + std::strerror(errno),
                "is /dev/shm full? free memory or lower checkpoint.memory.replicas");
  }
  std::string path_;
  int fd_ = -1;
  void* data_ = nullptr;
  size_t n_ = 0;
};

// Sends `data` to `to` while receiving `from`'s bytes (two tags: size,
// bytes) straight into <dir>/<name>: a mapped file under a name of this
// rank's, renamed once whole, after `before_rename` (the peer mark).
void exchange_into(comm::Group& g, const at::Tensor& data, int to, int from, int tag, const std::string& dir,
                   const std::string& name, int rank, const std::function<void()>& before_rename) {
  at::Tensor size_out = at::full({1}, data.numel(), at::kLong), size_in = at::empty({1}, at::kLong);
  auto a = g.send(size_out, to, tag);
  auto b = g.recv(size_in, from, tag);
  a->wait();
  b->wait();
  const std::string tmp = dir + "/." + name + ".tmp" + std::to_string(rank);
  {
    Mapped in = Mapped::create(tmp, size_t(size_in.item<int64_t>()));
    at::Tensor bytes = in.bytes();
    a = g.send(data, to, tag + 1);
    b = g.recv(bytes, from, tag + 1);
    a->wait();
    b->wait();
  }
  before_rename();
  fs::rename(tmp, dir + "/" + name);
}

// `root`'s bytes on every rank.
at::Tensor broadcast_bytes(comm::Group& g, at::Tensor data, int root) {
  at::Tensor size = at::full({1}, g.rank() == root ? data.numel() : 0, at::kLong);
  g.broadcast(size, root);
  if (g.rank() != root) data = at::empty({size.item<int64_t>()}, at::kByte);
  g.broadcast(data, root);
  return data;
}

void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

// Drops the copies of `root` newer than `step`, and other copies of `step`
// than `keep` (-1: none of them goes): after a restore they belong to a
// timeline that was abandoned.
void drop_newer(const std::string& root, int64_t step, int64_t keep = -1) {
  std::error_code ec;
  std::vector<std::string> stale;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto [n, id] = copy_of(e.path().filename().string());
    if (n > step || (keep >= 0 && n == step && id != keep)) stale.push_back(e.path().string());
  }
  for (const auto& d : stale) remove_quietly(d);
}

// The id of the copy the writers of `g` are making: rank 0's draw, the same on every writer.
int64_t agree_copy_id(comm::Group& g) {
  int64_t mine = 0;
  if (g.rank() == 0) {
    std::random_device rd;
    mine = int64_t(((uint64_t(rd()) << 32) | uint64_t(rd())) % uint64_t(999999999999999999LL));
  }
  at::Tensor id = at::full({1}, mine, at::kLong);
  g.broadcast(id, 0);
  return id.item<int64_t>();
}

}  // namespace

bool memory_copies_on(const TrainState& s) {
  const int nodes = s.info->world / std::max(1, s.info->local_world);
  return !s.info->memory_dir.empty() && s.spec->checkpoint.memory_on(nodes);
}

namespace detail {

MemoryCopy prepare_memory_copy(const TrainState& s, int64_t step, const PreparedSave* host) {
  MemoryCopy c;
  c.step = step;
  c.root = s.info->memory_dir;
  c.rank = s.info->rank;
  if (host != nullptr) {  // shared: the tensors are refcounted, and neither writer changes them
    c.keep = host->keep;
    c.shards = host->shards;
    c.copied = host->copied;
  } else {
    PreparedSave p = take_snapshot(s, step);  // never aliasing live tensors: training goes on
    c.keep = std::move(p.keep);
    c.shards = std::move(p.shards);
    c.copied = p.copied;
  }
  c.index = index_of(s, step);
  const Layout& l = layout(s);
  const int replicas = std::min(s.spec->checkpoint.memory_replicas, int(l.nodes.size()) - 1);
  for (int d = 1; d <= replicas; ++d) c.peers.emplace_back(peer_rank(l, c.rank, d), peer_rank(l, c.rank, -d));
  return c;
}

uint64_t write_memory_copy(comm::Group& g, MemoryCopy& c) {
  const int64_t id = agree_copy_id(g);
  const std::string dir = step_path(c.root, c.step, id);
  const int rank = c.rank;
  fs::create_directories(dir);
  {
    const std::string tmp = dir + "/.tmp_rank_" + std::to_string(rank);
    fs::create_directories(tmp);
    if (c.copied.valid()) c.copied.get();  // the host copies, taken in the background, are complete
    ck::write_rank_file(tmp, rank_name(rank), std::move(c.shards));
    c.shards.clear();
    c.keep.clear();  // written: the host copies can go
    fs::remove(dir + "/" + peer_mark(rank));  // this node's own copy now
    fs::rename(tmp + "/" + rank_name(rank), dir + "/" + rank_name(rank));
    remove_quietly(tmp);
  }
  const std::string header = ck::index_to_json(c.index);
  write_atomic(dir, "header.json", header.data(), header.size(), rank);
  const Mapped mine = Mapped::open_read(dir + "/" + rank_name(rank));  // sent as it lies in RAM
  const at::Tensor data = mine.bytes();
  int tag = 2;
  for (const auto& [to, from] : c.peers) {
    const int peer = from;
    exchange_into(g, data, to, from, tag, dir, rank_name(from), rank, [&] {
      write_atomic(dir, peer_mark(peer), "", 0, rank);  // before the file: a copy is never taken for its own
    });
    tag += 2;
  }
  const uint64_t bytes = uint64_t(data.numel());
  g.barrier();  // step `step` is complete on every node: the older ones (and older copies of it) can go
  std::error_code ec;
  std::vector<std::string> stale;
  for (const auto& e : fs::directory_iterator(c.root, ec)) {
    const auto [n, other] = copy_of(e.path().filename().string());
    if (n >= 0 && (n < c.step || (n == c.step && other != id))) stale.push_back(e.path().string());
  }
  for (const auto& d : stale) remove_quietly(d);
  return bytes;
}

}  // namespace detail

namespace {

using Held = std::array<int64_t, kFields>;  // step, copy id, old rank, old world, peer copy
using CopyKey = std::pair<int64_t, int64_t>;  // step, copy id

// What this node's directory holds, newest steps first.
std::vector<Held> held_here(const std::string& root) {
  std::vector<Held> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto [step, id] = copy_of(e.path().filename().string());
    const std::string dir = e.path().string();
    if (step < 0 || !fs::exists(dir + "/header.json")) continue;
    std::ifstream in(dir + "/header.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const int64_t world = ck::index_from_json(text, dir + "/header.json").world;
    for (int64_t r = 0; r < world; ++r)
      if (fs::exists(dir + "/" + rank_name(r)))
        out.push_back({step, id, r, world, fs::exists(dir + "/" + peer_mark(r)) ? 1 : 0});
  }
  std::sort(out.begin(), out.end(), [](const Held& a, const Held& b) { return a[0] > b[0]; });
  if (out.size() > size_t(kMaxHeld)) out.resize(size_t(kMaxHeld));
  return out;
}

struct Holder {
  int rank = -1;  // new rank whose node holds the shard: the one that sends it
  bool peer = false;
  std::vector<int> here;  // every new rank whose node holds it (they read it there)
};

// Every rank's holdings -> (step, copy id) -> old rank -> holder (an own
// copy before a peer's, then the lowest rank), and each copy's old world.
std::map<CopyKey, std::map<int64_t, Holder>> gather_holdings(const TrainState& s, std::map<CopyKey, int64_t>* worlds) {
  const std::vector<Held> mine = held_here(s.info->memory_dir);
  at::Tensor t = at::full({kMaxHeld * kFields}, -1, at::kLong);
  for (size_t i = 0; i < mine.size(); ++i)
    for (int f = 0; f < kFields; ++f) t.data_ptr<int64_t>()[i * kFields + size_t(f)] = mine[i][size_t(f)];
  at::Tensor all = at::empty({s.info->world * kMaxHeld * kFields}, at::kLong);
  s.control->all_gather(t, all);
  std::map<CopyKey, std::map<int64_t, Holder>> out;
  const int64_t* p = all.data_ptr<int64_t>();
  for (int q = 0; q < s.info->world; ++q)
    for (int i = 0; i < kMaxHeld; ++i) {
      const int64_t* h = p + (int64_t(q) * kMaxHeld + i) * kFields;
      if (h[0] < 0) continue;
      const CopyKey key{h[0], h[1]};
      (*worlds)[key] = h[3];
      Holder& got = out[key][h[2]];
      if (got.rank < 0 || (got.peer && h[4] == 0)) {
        got.rank = q;
        got.peer = h[4] != 0;
      }
      got.here.push_back(q);
    }
  return out;
}

bool holds(const Holder& h, int rank) { return std::find(h.here.begin(), h.here.end(), rank) != h.here.end(); }

// Every old rank's file of step `held` into `dir`: a rank whose node holds
// the file links it (no copy); each other rank receives it from the file's
// holder, point to point, all transfers in flight at once. A broadcast would
// send every file to every node and make each write it again.
void gather_shards(comm::Group& g, const std::map<int64_t, Holder>& shards, const std::string& held,
                   const std::string& dir) {
  const int me = g.rank();
  constexpr int kTagBase = 4096;  // far below comm::kMaxUserTag; two per old rank (size, bytes)
  struct Incoming {
    int64_t r;
    at::Tensor size;
    std::unique_ptr<Mapped> file;  // <dir>/.<name>.tmp<rank>, renamed once received
    comm::WorkPtr work;
  };
  std::vector<Incoming> incoming;
  std::vector<std::unique_ptr<Mapped>> sent;  // mapped until their sends complete
  std::vector<at::Tensor> outgoing;
  std::vector<comm::WorkPtr> sends;
  for (const auto& [r, h] : shards) {
    const int tag = kTagBase + 2 * int(r);
    if (holds(h, me)) {
      std::error_code ec;
      fs::create_hard_link(held + "/" + rank_name(r), dir + "/" + rank_name(r), ec);
      if (ec) fs::copy_file(held + "/" + rank_name(r), dir + "/" + rank_name(r));  // throws naming both
    } else {
      Incoming in{r, at::empty({1}, at::kLong), nullptr, {}};
      in.work = g.recv(in.size, h.rank, tag);
      incoming.push_back(std::move(in));
    }
    if (h.rank != me) continue;
    at::Tensor data;  // read once, sent to every rank whose node lacks it
    for (int q = 0; q < g.size(); ++q) {
      if (holds(h, q)) continue;
      if (!data.defined()) {
        sent.push_back(std::make_unique<Mapped>(Mapped::open_read(held + "/" + rank_name(r))));
        data = sent.back()->bytes();
        outgoing.push_back(at::full({1}, data.numel(), at::kLong));
        outgoing.push_back(data);
      }
      sends.push_back(g.send(outgoing[outgoing.size() - 2], q, tag));
      sends.push_back(g.send(data, q, tag + 1));
    }
  }
  const auto tmp_of = [&](int64_t r) { return dir + "/." + rank_name(r) + ".tmp" + std::to_string(me); };
  for (auto& in : incoming) {
    in.work->wait();
    in.file = std::make_unique<Mapped>(Mapped::create(tmp_of(in.r), size_t(in.size.item<int64_t>())));
    at::Tensor data = in.file->bytes();
    in.work = g.recv(data, shards.at(in.r).rank, kTagBase + 2 * int(in.r) + 1);
  }
  for (auto& in : incoming) {
    in.work->wait();
    in.file.reset();  // unmapped and closed: the bytes are in the file
    fs::rename(tmp_of(in.r), dir + "/" + rank_name(in.r));
  }
  for (auto& w : sends) w->wait();
}

}  // namespace

int64_t restore_from_memory(const TrainState& s, int64_t disk_step) {
  const auto t0 = std::chrono::steady_clock::now();
  std::map<CopyKey, int64_t> worlds;
  const auto holdings = gather_holdings(s, &worlds);
  const auto t_agreed = std::chrono::steady_clock::now();  // every rank is here
  int64_t step = -1, id = -1;
  std::string missing;  // of the newest step that memory holds only in part
  for (auto it = holdings.rbegin(); it != holdings.rend() && it->first.first >= disk_step; ++it) {
    if (int64_t(it->second.size()) == worlds[it->first]) {  // every old rank of this one copy
      std::tie(step, id) = it->first;
      break;
    }
    for (int64_t r = 0; r < worlds[it->first] && missing.empty(); ++r)
      if (!it->second.count(r))
        missing = "step " + std::to_string(it->first.first) + " of rank " + std::to_string(r);
  }
  if (step < 0) {
    drop_newer(s.info->memory_dir, disk_step);  // every rank has read its node's holdings (the all-gather)
    if (s.info->rank == 0 && !missing.empty())
      DTRAIN_WARN("no node holds {} in memory (both copies are gone): resuming from {}", missing,
                  disk_step < 0 ? "the start (no checkpoint on disk)" : "disk, step " + std::to_string(disk_step));
    return -1;
  }
  const Layout& l = layout(s);  // collective: every rank here, before rank 0 names the nodes
  // The shards presented as a checkpoint directory in this node's memory,
  // so that the loader reshards them exactly as it does a disk checkpoint.
  const std::string dir = s.info->memory_dir + "/restore_rank_" + std::to_string(s.info->rank);
  remove_quietly(dir);
  fs::create_directories(dir);
  const std::string held = step_path(s.info->memory_dir, step, id);
  const auto& shards = holdings.at({step, id});
  gather_shards(*s.control, shards, held, dir);
  const auto t_gathered = std::chrono::steady_clock::now();
  const int header_from = shards.begin()->second.rank;
  at::Tensor header = header_from == s.info->rank ? read_bytes(held + "/header.json") : at::Tensor();
  header = broadcast_bytes(*s.control, header, header_from);
  ck::write_index(dir, ck::index_from_json(std::string(static_cast<const char*>(header.data_ptr()),
                                                       size_t(header.numel())),
                                           held + "/header.json"));
  const int64_t got = load(s, dir);
  const auto t_loaded = std::chrono::steady_clock::now();
  remove_quietly(dir);
  s.control->barrier();  // every holder has sent its shards
  drop_newer(s.info->memory_dir, step, id);
  if (s.info->rank == 0) {
    for (const auto& [r, h] : shards)
      DTRAIN_INFO("restored step {} of rank {} from {} memory on node {}", step, r, h.peer ? "peer" : "its own node's",
                  l.node[size_t(h.rank)]);
    const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    DTRAIN_INFO("resuming from step {} (in-memory copies; disk has {}) in {:.3f} s: {:.3f} s until every rank "
                "was here, {:.3f} s gathering the files, {:.3f} s loading", got,
                disk_step < 0 ? "none" : "step " + std::to_string(disk_step),
                secs(t0, std::chrono::steady_clock::now()), secs(t0, t_agreed), secs(t_agreed, t_gathered),
                secs(t_gathered, t_loaded));
  }
  return got;
}

}  // namespace dtrain::engine::checkpoint
