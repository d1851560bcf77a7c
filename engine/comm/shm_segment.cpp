// shm_segment.h: mapping the segment and setting it up collectively over
// the store (which rank creates it, how the others find and check it); the
// futex wait and the rank-order reduction the protocols share.
#include "engine/comm/shm_segment.h"

#include <ATen/ops/add.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "engine/comm/round_abort.h"

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

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void wake_all(Counter& c) { futex(&c.value, FUTEX_WAKE, INT_MAX, nullptr); }

namespace {
std::atomic<int64_t> g_shm_buffer_bytes{0};
}  // namespace

void count_shm_buffer_bytes(int64_t delta) { g_shm_buffer_bytes.fetch_add(delta, std::memory_order_relaxed); }
int64_t counted_shm_buffer_bytes() { return g_shm_buffer_bytes.load(std::memory_order_relaxed); }

void wait_until(Counter& c, uint32_t target, const ShmOptions& options, const std::string& group,
                const char* op, const char* what) {
  using Clock = std::chrono::steady_clock;
  if (reached(c.value.load(std::memory_order_acquire), target)) return;
  const auto start = Clock::now();
  const auto spin_until = start + std::chrono::microseconds(options.spin_us);
  while (Clock::now() < spin_until)
    if (reached(c.value.load(std::memory_order_acquire), target)) return;
  const auto deadline = start + std::chrono::duration<double>(options.timeout_s);
  for (;;) {
    const uint32_t seen = c.value.load(std::memory_order_acquire);
    if (reached(seen, target)) return;
    throw_if_round_aborted("a shared-memory wait");  // no socket to shut down here
    if (Clock::now() >= deadline)
      throw Error(ErrorCode::timeout,
                  fmt::format("{} on group {} (shared memory) waited {:g} s for the other "
                              "ranks ({})",
                              op, group, options.timeout_s, what),
                  "a peer did not reach the same collective in time (options.timeout_s); see its log");
    // Wake up to check the deadline and the round's abort flag.
    const timespec slice{0, 100'000'000};
    futex(&c.value, FUTEX_WAIT, seen, &slice);
  }
}

bool shm_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kDouble || t == at::kInt || t == at::kLong; }

void reduce_in_rank_order(at::Tensor& acc, int n, const std::function<at::Tensor(int)>& piece, ReduceOp op) {
  auto combine = [&](const at::Tensor& a, const at::Tensor& b) {
    if (op == ReduceOp::sum) at::add_out(acc, a, b);
    else if (op == ReduceOp::max) at::maximum_out(acc, a, b);
    else at::minimum_out(acc, a, b);
  };
  combine(piece(0), piece(1));
  for (int j = 2; j < n; ++j) combine(acc, piece(j));
}

namespace {

// Plain loops the compiler vectorises (AVX2 clone picked at load time);
// no FMA can fuse a lone add, so both clones give IEEE sums.
template <typename T>
__attribute__((target_clones("avx2", "default"))) void add_block(T* __restrict a, const T* __restrict b,
                                                                  int64_t len) {
  for (int64_t i = 0; i < len; ++i) a[i] = a[i] + b[i];
}

template <typename T>
__attribute__((target_clones("avx2", "default"))) void add2_block(T* __restrict out, const T* __restrict a,
                                                                   const T* __restrict b, int64_t len) {
  for (int64_t i = 0; i < len; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void sum_into_typed(char* out, const char* const* pieces, int n, int64_t elems) {
  constexpr int64_t block = kSumBlockBytes / static_cast<int64_t>(sizeof(T));
  for (int64_t off = 0; off < elems; off += block) {
    const int64_t len = std::min(block, elems - off);
    T* acc = reinterpret_cast<T*>(out) + off;
    add2_block(acc, reinterpret_cast<const T*>(pieces[0]) + off, reinterpret_cast<const T*>(pieces[1]) + off, len);
    for (int j = 2; j < n; ++j) add_block(acc, reinterpret_cast<const T*>(pieces[j]) + off, len);
  }
}

template <typename T>
void sum_to_all_typed(char* const* regions, int n, int64_t elems, bool copy_out) {
  constexpr int64_t block = kSumBlockBytes / static_cast<int64_t>(sizeof(T));
  for (int64_t off = 0; off < elems; off += block) {
    const int64_t len = std::min(block, elems - off);
    T* acc = reinterpret_cast<T*>(regions[0]) + off;
    for (int j = 1; j < n; ++j) add_block(acc, reinterpret_cast<const T*>(regions[j]) + off, len);
    if (copy_out)
      for (int j = 1; j < n; ++j) std::memcpy(reinterpret_cast<T*>(regions[j]) + off, acc, size_t(len) * sizeof(T));
  }
}

}  // namespace

bool sum_to_all(char* const* regions, int n, int64_t elems, at::ScalarType dtype) {
  if (dtype == at::kFloat) sum_to_all_typed<float>(regions, n, elems, true);
  else if (dtype == at::kDouble) sum_to_all_typed<double>(regions, n, elems, true);
  else return false;
  return true;
}

// f(T{}) for a dtype the segments add (shm_dtype); false for another.
template <typename F>
bool with_shm_type(at::ScalarType dtype, F&& f) {
  switch (dtype) {
    case at::kFloat: f(float{}); return true;
    case at::kDouble: f(double{}); return true;
    case at::kInt: f(int32_t{}); return true;
    case at::kLong: f(int64_t{}); return true;
    default: return false;
  }
}

bool sum_into(char* out, const char* const* pieces, int n, int64_t elems, at::ScalarType dtype) {
  return with_shm_type(dtype, [&](auto t) { sum_into_typed<decltype(t)>(out, pieces, n, elems); });
}

bool sum_to_first(char* const* regions, int n, int64_t elems, at::ScalarType dtype) {
  return with_shm_type(dtype, [&](auto t) { sum_to_all_typed<decltype(t)>(regions, n, elems, false); });
}

}  // namespace dtrain::engine::comm::detail
