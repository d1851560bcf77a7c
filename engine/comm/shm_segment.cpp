// shm_segment.h: mapping the segment and setting it up collectively over
// the store (which rank creates it, how the others find and check it).
#include "engine/comm/shm_segment.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

namespace dtrain::engine::comm::detail {

namespace {

// Maps an existing segment (flags O_RDWR) or a new one (O_CREAT | O_EXCL);
// null with `why` set when it cannot.
std::unique_ptr<Segment> map_segment(const std::string& name, int flags, size_t bytes, std::string& why) {
  int fd = shm_open(name.c_str(), flags, 0600);
  if (fd < 0) {
    why = "shm_open " + name + ": " + std::strerror(errno);
    return nullptr;
  }
  if (flags & O_CREAT) {
    // Reserve every page now: tmpfs that runs out later would SIGBUS a rank
    // mid-collective; here it is an error we fall back from.
    int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc != 0) {
      why = "posix_fallocate " + std::to_string(bytes) + " bytes in /dev/shm: " + std::strerror(rc);
      close(fd);
      return nullptr;
    }
  } else {
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      why = "segment " + name + " has another size";
      close(fd);
      return nullptr;
    }
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    why = "mmap " + name + ": " + std::strerror(errno);
    return nullptr;
  }
  return std::make_unique<Segment>(base, bytes);
}

std::string text_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

std::unique_ptr<Segment> open_shared(const Group& g, c10d::Store& store, const std::string& key,
                                     const ShmOptions& options, std::string& why) {
  const int n = g.size();
  return open_shared_bytes(g, store, key, segment_bytes(n, options.slot_bytes), kMagic, options.node,
                           [&](char* base) {
                             Header& h = *reinterpret_cast<Header*>(base);
                             h.slot_bytes = static_cast<uint64_t>(options.slot_bytes);
                             h.members = static_cast<uint32_t>(n);
                           },
                           why);
}

std::unique_ptr<Segment> open_shared_bytes(const Group& g, c10d::Store& store, const std::string& key,
                                           size_t bytes, uint64_t magic, int node,
                                           const std::function<void(char*)>& init, std::string& why) {
  const int n = g.size(), me = g.rank();
  std::unique_ptr<Segment> seg;
  std::string name;
  uint64_t nonce = 0;
  auto id = [](const Segment& s) { return reinterpret_cast<uint64_t*>(s.base()); };  // {magic, nonce}
  if (me == 0) {
    std::random_device rd;
    nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    name = "/dtrain-" + std::to_string(getpid()) + "-" + std::to_string(nonce);
    seg = map_segment(name, O_CREAT | O_EXCL | O_RDWR, bytes, why);
    if (seg) {
      id(*seg)[1] = nonce;
      init(seg->base());
      id(*seg)[0] = magic;  // last: a mapper that sees it sees the rest
    }
    store.set(key + "/name", bytes_of(seg ? name + " " + std::to_string(nonce) : std::string("-")));
    store.set(key + "/node", bytes_of(std::to_string(node)));
  } else {
    const std::string published = text_of(store.get(key + "/name"));
    const std::string node0 = text_of(store.get(key + "/node"));
    const auto space = published.find(' ');
    if (node0 != std::to_string(node)) {
      why = "its ranks are on nodes " + node0 + " and " + std::to_string(node);
    } else if (space == std::string::npos) {
      why = "rank 0 of the group could not create a segment";
    } else {
      name = published.substr(0, space);
      nonce = std::stoull(published.substr(space + 1));
      seg = map_segment(name, O_RDWR, bytes, why);
      // Same name on another machine's /dev/shm would be another segment.
      if (seg && (id(*seg)[0] != magic || id(*seg)[1] != nonce)) {
        why = "segment " + name + " is not the group's (another machine)";
        seg.reset();
      }
    }
  }
  store.set(key + "/ok/" + std::to_string(me), bytes_of(seg ? "1" : why));
  bool all = true;
  for (int r = 0; r < n; ++r) {
    const std::string ok = text_of(store.get(key + "/ok/" + std::to_string(r)));
    if (ok != "1") {
      all = false;
      if (why.empty()) why = "rank " + std::to_string(r) + " of the group: " + ok;
    }
  }
  if (me == 0 && !name.empty()) shm_unlink(name.c_str());  // every member has mapped it or given up
  return all ? std::move(seg) : nullptr;
}

}  // namespace dtrain::engine::comm::detail
