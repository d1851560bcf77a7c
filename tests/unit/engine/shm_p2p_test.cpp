// engine/comm's shared-memory send/recv (shm_p2p.h) on ranks as threads of
// this process: messages to both ring neighbours and to a rank that is not
// one (Gloo), sizes up to 5x the ring (streamed, wrapping), repeated and
// out-of-order tags, receives posted in another order than the sends and
// waited for in a third; every byte equal to what was sent and to what
// Gloo delivers. Also: members on different nodes fall back to Gloo, a
// wait leaves when the round is aborted, and no segment stays in /dev/shm.
#include <ATen/ops/arange.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "engine/comm/comm.h"
#include "engine/comm/round_abort.h"
#include "engine/comm/shm_p2p.h"

#include "tests/support/thread_world.h"
#include "tests/support/torch_doctest.h"
// After torch_doctest.h: doctest's CHECK, not glog's.
#include "tests/support/skip.h"

namespace comm = dtrain::engine::comm;
using dtrain::testing::run_world;

namespace {

constexpr int64_t kSlot = 4096;  // ShmOptions slot: rings of 8 x 4 KiB = 32 KiB

// One message src -> dst: its tag, and its content seeded by (src, dst, i).
struct Message {
  int tag;
  at::Tensor data;
};

at::Tensor content(int seed, int64_t numel, at::ScalarType dtype) {
  auto i = at::arange(numel, at::TensorOptions().dtype(at::kDouble));  // [numel]
  return ((i * 0.37 + seed * 1.3).sin() * 1000.0 + seed).to(dtype);
}

// Tags repeat (3 and 7 twice: same-tag messages match in send order) and
// reach the largest user tag; sizes go from 1 element to 5x the ring.
std::vector<Message> messages(int src, int dst) {
  const std::vector<int> tags{7, 3, 7, 0, comm::kMaxUserTag - 1, 3, 11};
  const std::vector<int64_t> sizes{1, 3, 1000, 8192, 40000, 8191, 517};
  std::vector<Message> out;
  for (size_t i = 0; i < tags.size(); ++i) {
    const auto dtype = i == 2 ? at::kBFloat16 : i == 4 ? at::kLong : at::kFloat;
    out.push_back({tags[i], content(src * 100 + dst * 10 + int(i), sizes[(i + size_t(src + dst)) % sizes.size()], dtype)});
  }
  return out;
}

// The receiver's post order: tags descending, same-tag messages in send
// order (what the matching needs to be told apart from arrival order).
std::vector<size_t> post_order(const std::vector<Message>& ms) {
  std::vector<size_t> order(ms.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms[a].tag > ms[b].tag; });
  return order;
}

std::vector<int> peers_of(int r, int n) {  // both ring neighbours, and r + 2 (not one) at n = 4
  std::vector<int> peers;
  for (int p : {(r + 1) % n, (r + n - 1) % n, n == 4 ? (r + 2) % n : r})
    if (p != r && std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);
  return peers;
}

using Received = std::map<std::tuple<int, int, size_t>, std::vector<char>>;  // (dst, src, message) -> bytes

// Every rank sends all its messages to each peer (async), then posts every
// receive in post_order and waits for them in reverse, then for its sends.
void exchange(comm::Comm& c, int r, int n, Received& got, std::mutex& mu, bool& shm_path) {
  comm::Group& pp = c.axis("pp");
  {
    std::lock_guard<std::mutex> lock(mu);
    shm_path = comm::detail::uses_shm_p2p(pp);
  }
  std::vector<comm::WorkPtr> sends;
  std::vector<at::Tensor> keep;
  for (int p : peers_of(r, n))
    for (const Message& m : messages(r, p)) {
      keep.push_back(m.data);
      sends.push_back(pp.send(keep.back(), p, m.tag));
    }
  std::vector<std::tuple<int, size_t, at::Tensor, comm::WorkPtr>> recvs;
  for (int p : peers_of(r, n)) {
    const auto ms = messages(p, r);
    for (size_t i : post_order(ms)) {
      at::Tensor buf = at::empty_like(ms[i].data);
      auto w = pp.recv(buf, p, ms[i].tag);
      recvs.emplace_back(p, i, buf, w);
    }
  }
  for (auto it = recvs.rbegin(); it != recvs.rend(); ++it) std::get<3>(*it)->wait();
  for (auto& w : sends) w->wait();
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [p, i, buf, w] : recvs) {
    const char* b = static_cast<const char*>(buf.data_ptr());
    got[{r, p, i}] = std::vector<char>(b, b + buf.nbytes());
  }
}

bool bytes_equal(const std::vector<char>& a, const at::Tensor& t) {
  return a.size() == t.nbytes() && std::memcmp(a.data(), t.data_ptr(), a.size()) == 0;
}

int dtrain_segments_of_this_process() {
  const std::string head = "dtrain-" + std::to_string(getpid()) + "-";
  int count = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) count += std::string(e->d_name).rfind(head, 0) == 0;
    closedir(d);
  }
  return count;
}

}  // namespace

TEST_CASE("shm send/recv: every byte as sent and as Gloo delivers, any tag order, streamed past the ring") {
  if (access("/dev/shm", W_OK) != 0) {
    dtrain::testing::skip_case(dtrain::testing::SkipKind::dev_shm, "/dev/shm is not writable here");
    return;
  }
  enum Mode { shm, gloo, two_nodes };
  int checked = 0, wrong = 0, shm_vs_gloo_differ = 0;
  for (int n : {2, 4}) {
    std::map<Mode, Received> got;
    for (Mode mode : {shm, gloo, two_nodes}) {
      std::mutex mu;
      bool shm_path = false;
      Received& into = got[mode];  // made here: the rank threads only fill it, under mu
      run_world(comm::parse_mesh("pp=" + std::to_string(n)),
                [&](comm::Comm& c, int r) { exchange(c, r, n, into, mu, shm_path); },
                [&](comm::WorldInfo& info, comm::CommOptions& o) {
                  o.shm = mode != gloo;
                  o.shm_slot_bytes = kSlot;
                  if (mode == two_nodes) info.node_rank = info.rank % 2;  // neighbours on other nodes
                });
      CHECK_MESSAGE(shm_path == (mode == shm), "n ", n, " mode ", int(mode), ": p2p path shm = ", shm_path);
    }
    for (const auto& [key, bytes] : got[shm]) {
      const auto [dst, src, i] = key;
      const Message sent = messages(src, dst)[i];
      for (Mode mode : {shm, gloo, two_nodes}) {
        ++checked;
        wrong += !bytes_equal(got[mode].at(key), sent.data);
      }
      shm_vs_gloo_differ += got[gloo].at(key) != bytes;
    }
  }
  // Control: had receives matched in arrival order instead of by tag, this
  // many of them (of 7 per pair) would hold another message's bytes.
  int fifo_differs = 0, per_pair = 0;
  const auto ms = messages(0, 1);
  const auto order = post_order(ms);
  for (size_t k = 0; k < ms.size(); ++k, ++per_pair) {
    const Message &by_tag = ms[order[k]], &by_arrival = ms[k];
    fifo_differs += by_tag.data.nbytes() != by_arrival.data.nbytes() ||
                    std::memcmp(by_tag.data.data_ptr(), by_arrival.data.data_ptr(), by_tag.data.nbytes()) != 0;
  }
  const int leftover = dtrain_segments_of_this_process();
  std::printf("shm send/recv: %d received messages checked (shm, Gloo, two nodes), %d not bit-equal to what was "
              "sent (tolerance 0), %d differ between shm and Gloo; control: matching by arrival order would put "
              "other bytes in %d of %d receives; /dev/shm segments left: %d\n",
              checked, wrong, shm_vs_gloo_differ, fifo_differs, per_pair, leftover);
  CHECK(checked > 0);
  CHECK(wrong == 0);
  CHECK(shm_vs_gloo_differ == 0);
  CHECK(fifo_differs > 0);  // the check above can tell tag matching from arrival order
  CHECK(leftover == 0);
}

TEST_CASE("shm send/recv: a receive waiting for a message leaves when the round is aborted") {
  if (access("/dev/shm", W_OK) != 0) {
    dtrain::testing::skip_case(dtrain::testing::SkipKind::dev_shm, "/dev/shm is not writable here");
    return;
  }
  std::string message;
  dtrain::ErrorCode code = dtrain::ErrorCode::internal;
  bool shm_path = false;
  run_world(comm::parse_mesh("pp=2"), [&](comm::Comm& c, int r) {
    if (r != 1) return;  // rank 0 never sends: only the abort ends rank 1's wait
    shm_path = comm::detail::uses_shm_p2p(c.axis("pp"));
    at::Tensor buf = at::empty({16}, at::kFloat);
    comm::abort_round();
    try {
      c.axis("pp").recv(buf, 0, 5)->wait();
    } catch (const dtrain::Error& e) {
      message = e.what();
      code = e.code();
    }
    comm::clear_round_abort();
  }, [](comm::WorldInfo&, comm::CommOptions& o) { o.timeout_s = 3; });
  std::printf("shm recv under an aborted round: %s\n", message.c_str());
  CHECK(shm_path);
  CHECK(code == dtrain::ErrorCode::worker_failed);  // not the 3-s timeout
  CHECK(message.find("new round") != std::string::npos);
}

TEST_CASE("shm send/recv: a receive of the wrong size is an error naming both sizes; the next message arrives") {
  if (access("/dev/shm", W_OK) != 0) {
    dtrain::testing::skip_case(dtrain::testing::SkipKind::dev_shm, "/dev/shm is not writable here");
    return;
  }
  // Both orders, each fixed by an event (no sleep): the receive posted
  // before the message arrives (tag 1), and after it is in the ring (tag 3:
  // a shared-memory send completes without its receive). A hang guard ends
  // a wait that never comes with a failure instead of a hang.
  constexpr auto kHangGuard = std::chrono::seconds(60);
  std::promise<void> posted, sent;
  std::vector<std::string> messages_seen;
  double next_diff = -1;
  bool hung = false;
  run_world(comm::parse_mesh("pp=2"), [&](comm::Comm& c, int r) {
    comm::Group& pp = c.axis("pp");
    const at::Tensor eight = content(1, 8, at::kFloat), four = content(2, 4, at::kFloat);
    if (r == 0) {
      hung |= posted.get_future().wait_for(kHangGuard) == std::future_status::timeout;
      pp.send(eight, 1, 1)->wait();
      pp.send(four, 1, 2)->wait();
      pp.send(eight, 1, 3)->wait();
      sent.set_value();
      return;
    }
    at::Tensor small = at::empty({4}, at::kFloat), next = at::empty({4}, at::kFloat);
    auto first = pp.recv(small, 0, 1);
    posted.set_value();
    hung |= sent.get_future().wait_for(kHangGuard) == std::future_status::timeout;
    auto late = pp.recv(small, 0, 3);
    for (auto& w : {first, late}) {
      try {
        w->wait();
      } catch (const dtrain::Error& e) {
        messages_seen.push_back(e.what());
      }
    }
    pp.recv(next, 0, 2)->wait();
    next_diff = (next - four).abs().max().item<double>();
  }, [](comm::WorldInfo&, comm::CommOptions& o) { o.timeout_s = 10; });
  for (const auto& m : messages_seen) std::printf("shm recv of the wrong size: %s\n", m.c_str());
  std::printf("shm recv of the wrong size: the next message's max diff %g (tolerance 0)\n", next_diff);
  CHECK(!hung);
  REQUIRE(messages_seen.size() == 2);
  CHECK(messages_seen[0].find("sent 32 bytes under tag 1, the receive holds 16") != std::string::npos);
  CHECK(messages_seen[1].find("sent 32 bytes under tag 3, the receive holds 16") != std::string::npos);
  CHECK(next_diff == 0);
}
