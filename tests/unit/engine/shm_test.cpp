// engine/comm's shared-memory collectives (shm_group.h) on ranks as threads
// of this process: chunked tensors (slots smaller than the tensor), sizes
// that leave some ranks no part, all_reduce sum/max/min, all_gather and
// reduce_scatter on fp32, fp64, int32, int64, async ops of all three kinds
// completing in call order beside sync ones, a peer that never arrives, and
// symmetric buffers (symmetric_buffer.h) reduced in place (a sum's work
// shared by the members, the last-arriver protocol its control), and a
// shared buffer whose writes every member sees (a private one's: the
// control).
// Sums add in rank order, so they equal that reference exactly; Gloo's ring
// adds in another order (the negative control).
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

#include "common/error.h"
#include "engine/comm/comm.h"
#include "engine/comm/shm_symmetric.h"
#include "engine/comm/symmetric_buffer.h"

#include "tests/support/thread_world.h"
#include "tests/support/torch_doctest.h"
// After torch_doctest.h: doctest's CHECK, not glog's.
#include "tests/support/skip.h"

namespace comm = dtrain::engine::comm;
using dtrain::testing::run_world;

namespace {

at::Tensor input(int r, int64_t numel, at::ScalarType dtype) {
  auto i = at::arange(numel, at::TensorOptions().dtype(at::kDouble));  // [numel]
  auto x = (i * 0.37 + r * 1.3).sin() * (r + 1) * 1000.0;
  return (dtype == at::kFloat || dtype == at::kDouble) ? (x / 7.0).to(dtype) : x.to(dtype);
}

// Rank-order reduction x0 (op) x1 (op) ... in the tensor's own dtype.
at::Tensor reference(int n, int64_t numel, at::ScalarType dt, comm::ReduceOp op) {
  at::Tensor acc = input(0, numel, dt);
  for (int q = 1; q < n; ++q) {
    at::Tensor x = input(q, numel, dt);
    acc = op == comm::ReduceOp::sum ? acc + x : op == comm::ReduceOp::max ? at::maximum(acc, x) : at::minimum(acc, x);
  }
  return acc;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item().toDouble();
}

// The shared-memory path needs a writable /dev/shm (every Linux machine and
// container has one unless it was taken away); without it the tests say so.
bool have_dev_shm() {
  if (access("/dev/shm", W_OK) == 0) return true;
  dtrain::testing::skip_case(dtrain::testing::SkipKind::dev_shm,
                             "/dev/shm is not writable here, so every all-reduce takes Gloo's TCP");
  return false;
}

comm::CommOptions small_slots(bool shm) {
  comm::CommOptions o;
  o.shm = shm;
  o.shm_slot_bytes = 4096;  // 1024 fp32: most sizes below take several chunks
  o.timeout_s = 60;
  return o;
}

// body(comm, rank, n, shm) on dp=n for n = 2, 3, 4, with shared memory on
// (the path under test) and off (Gloo: the negative control).
void each_world(const std::function<void(comm::Comm&, int, int, bool)>& body) {
  for (int n : {2, 3, 4})
    for (bool shm : {true, false})
      run_world(comm::parse_mesh("dp=" + std::to_string(n)), [&](comm::Comm& c, int r) { body(c, r, n, shm); },
                [&](comm::WorldInfo&, comm::CommOptions& o) { o = small_slots(shm); });
}

}  // namespace

TEST_CASE("shm all_reduce: chunked, every dtype and op, equal to the rank-order reduction") {
  if (!have_dev_shm()) return;
  double worst = 0, gloo_vs_order = 0;
  std::mutex mu;
  each_world([&](comm::Comm& c, int r, int n, bool shm) {
    for (auto dt : {at::kFloat, at::kDouble, at::kInt, at::kLong})
      for (auto op : {comm::ReduceOp::sum, comm::ReduceOp::max, comm::ReduceOp::min})
        for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{1023}, int64_t{1025}, int64_t{10007}}) {
          at::Tensor t = input(r, m, dt);
          c.axis("dp").all_reduce(t, false, op);
          const double d = max_diff(t, reference(n, m, dt, op));
          std::lock_guard<std::mutex> lock(mu);
          if (shm) worst = std::max(worst, d);
          else if (dt == at::kFloat && op == comm::ReduceOp::sum) gloo_vs_order = std::max(gloo_vs_order, d);
        }
  });
  std::printf("shm all_reduce vs the rank-order reduction: max diff %.3g (tolerance 0, exact); "
              "Gloo's ring fp32 sum vs the same: %.3g (must differ)\n", worst, gloo_vs_order);
  CHECK(worst == 0);
  CHECK(gloo_vs_order > 0);  // the check above could tell the two paths apart
}

TEST_CASE("shm all_gather and reduce_scatter: chunked, every dtype, exact; Gloo's ring differs") {
  if (!have_dev_shm()) return;
  double worst = 0, gloo_vs_order = 0;
  std::mutex mu;
  each_world([&](comm::Comm& c, int r, int n, bool shm) {
    for (auto dt : {at::kFloat, at::kDouble, at::kInt, at::kLong})
      for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{341}, int64_t{1025}, int64_t{10007}}) {
        // reduce_scatter: rank q's input is input(q, n m); rank r gets
        // block r of the rank-order sum.
        at::Tensor out = at::empty({m}, at::TensorOptions().dtype(dt));
        c.axis("dp").reduce_scatter(input(r, n * m, dt), out);
        const double d_rs = max_diff(out, reference(n, n * m, dt, comm::ReduceOp::sum).narrow(0, r * m, m));
        at::Tensor gathered = at::empty({n * m}, at::TensorOptions().dtype(dt));
        c.axis("dp").all_gather(input(r, m, dt), gathered);
        double d_ag = 0;
        for (int q = 0; q < n; ++q) d_ag = std::max(d_ag, max_diff(gathered.narrow(0, q * m, m), input(q, m, dt)));
        std::lock_guard<std::mutex> lock(mu);
        if (shm) worst = std::max({worst, d_rs, d_ag});
        else if (dt == at::kFloat) gloo_vs_order = std::max(gloo_vs_order, d_rs);
      }
  });
  std::printf("shm all_gather and reduce_scatter vs concatenation / rank-order sum: max diff %.3g "
              "(tolerance 0, exact); Gloo's ring fp32 reduce_scatter vs the same: %.3g (must differ)\n",
              worst, gloo_vs_order);
  CHECK(worst == 0);
  CHECK(gloo_vs_order > 0);
}

TEST_CASE("shm: async ops of all three kinds finish beside sync ones; the world group too") {
  if (!have_dev_shm()) return;
  std::mutex mu;
  double worst = 0;
  run_world(comm::parse_mesh("dp=3"), [&](comm::Comm& c, int r) {
    std::vector<at::Tensor> ts;
    std::vector<comm::WorkPtr> works;
    for (int i = 0; i < 6; ++i) {
      ts.push_back(input(r + i, 3000 + i, at::kFloat));
      works.push_back(c.axis("dp").all_reduce(ts.back(), /*async=*/true));
    }
    at::Tensor s = input(r, 50, at::kDouble);
    c.axis("dp").all_reduce(s);  // waits behind the six
    at::Tensor w = input(r, 2049, at::kFloat);
    c.world().all_reduce(w, false, comm::ReduceOp::max);  // another group, another segment
    // All three kinds in flight at once, more chunks than staging sets
    // (4 KiB slots: 10 + 30 chunks), waited for in reverse order.
    at::Tensor gathered = at::empty({3 * 10007}, at::kFloat), scattered = at::empty({10007}, at::kFloat);
    auto ag = c.axis("dp").all_gather(input(r, 10007, at::kFloat), gathered, /*async=*/true);
    auto rs = c.axis("dp").reduce_scatter(input(r, 3 * 10007, at::kFloat), scattered, /*async=*/true);
    rs->wait();
    ag->wait();
    for (auto& wk : works) wk->wait();
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < 6; ++i) {
      at::Tensor want = input(i, 3000 + i, at::kFloat);
      for (int q = 1; q < 3; ++q) want = want + input(q + i, 3000 + i, at::kFloat);
      worst = std::max(worst, max_diff(ts[i], want));
    }
    worst = std::max(worst, max_diff(s, reference(3, 50, at::kDouble, comm::ReduceOp::sum)));
    worst = std::max(worst, max_diff(w, reference(3, 2049, at::kFloat, comm::ReduceOp::max)));
    for (int q = 0; q < 3; ++q)
      worst = std::max(worst, max_diff(gathered.narrow(0, q * 10007, 10007), input(q, 10007, at::kFloat)));
    worst = std::max(worst, max_diff(scattered, reference(3, 3 * 10007, at::kFloat, comm::ReduceOp::sum)
                                                    .narrow(0, r * 10007, 10007)));
  }, [](comm::WorldInfo&, comm::CommOptions& o) { o = small_slots(true); });
  std::printf("shm async/sync mix: max diff %.3g (tolerance 0)\n", worst);
  CHECK(worst == 0);
}

TEST_CASE("shm all_reduce: a peer that never arrives is a timeout naming the group") {
  if (!have_dev_shm()) return;
  std::string message;
  // Rank 1 stays out of the all-reduce until rank 0's call has returned (an
  // event, not a sleep). Should rank 0's call never time out, rank 1 joins
  // it after kHangGuard (a hang guard, no claim on speed) so the test ends
  // with a failure instead of hanging.
  constexpr auto kHangGuard = std::chrono::seconds(60);
  std::promise<void> rank0_returned;
  std::future<void> returned = rank0_returned.get_future();
  bool rescued = false;
  double waited_s = 0;
  run_world(comm::parse_mesh("dp=2"), [&](comm::Comm& c, int r) {
    if (r == 1) {  // meets rank 0 again in run_world's barrier
      if (returned.wait_for(kHangGuard) == std::future_status::timeout) {
        rescued = true;
        at::Tensor t = input(1, 10, at::kFloat);
        c.axis("dp").all_reduce(t);
      }
      return;
    }
    at::Tensor t = input(0, 10, at::kFloat);
    const auto start = std::chrono::steady_clock::now();
    try {
      c.axis("dp").all_reduce(t);
    } catch (const dtrain::Error& e) {
      message = e.what();
      CHECK(e.code() == dtrain::ErrorCode::timeout);
    }
    waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rank0_returned.set_value();
  }, [](comm::WorldInfo&, comm::CommOptions& o) {
    o = small_slots(true);
    o.timeout_s = 3;
  });
  CHECK_MESSAGE(!rescued, "rank 0's all-reduce did not time out (timeout_s 3) within the hang guard");
  std::printf("shm timeout after %.2f s (timeout_s 3): %s\n", waited_s, message.c_str());
  CHECK(waited_s >= 3.0);  // the timeout, not an early give-up
  CHECK(message.find("group dp") != std::string::npos);
  CHECK(message.find("shared memory") != std::string::npos);
}

// symmetric_buffer.h: ranges of each rank's symmetric buffer all-reduced in
// place, async, more ops in flight than the segment has slots (64), at the
// buffer's start, middle and end; every dtype and op equal to the rank-order
// reduction, exactly. Control: the same ranges in plain tensors through
// Gloo's ring (shared memory off, where symmetric_buffer gives nothing).
TEST_CASE("shm symmetric buffer: ranges all-reduced in place, every dtype and op, equal to the rank-order reduction") {
  if (!have_dev_shm()) return;
  double worst = 0, gloo_vs_order = 0;
  int buffers = 0, undefined_without_shm = 0, worlds_without_shm = 0;
  std::mutex mu;
  const std::vector<int64_t> sizes = {1, 3, 1023, 1025, 10007};
  each_world([&](comm::Comm& c, int r, int n, bool shm) {
    for (auto dt : {at::kFloat, at::kDouble, at::kInt, at::kLong})
      for (auto op : {comm::ReduceOp::sum, comm::ReduceOp::max, comm::ReduceOp::min}) {
        // 70 ranges: the five sizes 14 times over, each at its own offset.
        std::vector<std::pair<int64_t, int64_t>> ranges;  // (offset, numel)
        int64_t total = 0;
        for (int k = 0; k < 70; ++k) {
          const int64_t m = sizes[size_t(k) % sizes.size()];
          ranges.emplace_back(total, m);
          total += m + (k % 3);  // gaps of 0-2 elements between ranges
        }
        at::Tensor buf = comm::symmetric_buffer(c.axis("dp"), total, dt);
        {
          std::lock_guard<std::mutex> lock(mu);
          if (buf.defined()) ++buffers;
          if (!shm) ++worlds_without_shm, undefined_without_shm += buf.defined() ? 0 : 1;
        }
        if (!buf.defined()) buf = at::empty({total}, at::TensorOptions().dtype(dt));
        std::vector<comm::WorkPtr> works;
        for (auto [off, m] : ranges) {
          at::Tensor t = buf.narrow(0, off, m);
          t.copy_(input(r + int(off % 5), m, dt));
          works.push_back(c.axis("dp").all_reduce(t, /*async=*/true, op));
        }
        for (auto& w : works) w->wait();
        double d = 0;
        for (auto [off, m] : ranges) {
          at::Tensor want = input(int(off % 5), m, dt);
          for (int q = 1; q < n; ++q) {
            at::Tensor x = input(q + int(off % 5), m, dt);
            want = op == comm::ReduceOp::sum   ? want + x
                   : op == comm::ReduceOp::max ? at::maximum(want, x)
                                               : at::minimum(want, x);
          }
          d = std::max(d, max_diff(buf.narrow(0, off, m), want));
        }
        std::lock_guard<std::mutex> lock(mu);
        if (shm) worst = std::max(worst, d);
        else if (dt == at::kFloat && op == comm::ReduceOp::sum) gloo_vs_order = std::max(gloo_vs_order, d);
      }
  });
  std::printf("shm symmetric buffer: %d buffers made; in-place all_reduce vs the rank-order reduction: max diff %.3g "
              "(tolerance 0, exact); Gloo's ring fp32 sum vs the same: %.3g (must differ); without shared memory "
              "%d of %d calls gave no buffer\n",
              buffers, worst, gloo_vs_order, undefined_without_shm, worlds_without_shm);
  CHECK(buffers == 12 * (2 + 3 + 4));  // every rank, every dtype and op, with shared memory on
  CHECK(undefined_without_shm == worlds_without_shm);
  CHECK(worst == 0);
  CHECK(gloo_vs_order > 0);
}

TEST_CASE("shm symmetric buffer: ranks passing different ranges is an error on every rank; "
          "DTRAIN_SYMMETRIC_BUFFERS=0 gives none") {
  if (!have_dev_shm()) return;
  std::mutex mu;
  std::vector<std::string> messages;
  run_world(comm::parse_mesh("dp=2"), [&](comm::Comm& c, int r) {
    at::Tensor buf = comm::symmetric_buffer(c.axis("dp"), 100, at::kFloat);
    REQUIRE(buf.defined());
    at::Tensor t = buf.narrow(0, r == 0 ? 0 : 10, 20);  // rank 1 is 10 elements off
    try {
      c.axis("dp").all_reduce(t);
    } catch (const dtrain::Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(e.what());
      CHECK(e.code() == dtrain::ErrorCode::internal);
    }
    // The group still works: a staged all-reduce after it.
    at::Tensor s = input(r, 7, at::kFloat);
    c.axis("dp").all_reduce(s);
    CHECK(max_diff(s, reference(2, 7, at::kFloat, comm::ReduceOp::sum)) == 0);
  }, [](comm::WorldInfo&, comm::CommOptions& o) { o = small_slots(true); });
  REQUIRE(messages.size() == 2);
  std::printf("shm symmetric buffer, different ranges: %s\n", messages[0].c_str());
  for (const auto& m : messages) CHECK(m.find("different ranges") != std::string::npos);

  setenv("DTRAIN_SYMMETRIC_BUFFERS", "0", 1);
  int defined = 0;
  run_world(comm::parse_mesh("dp=2"), [&](comm::Comm& c, int) {
    at::Tensor buf = comm::symmetric_buffer(c.axis("dp"), 100, at::kFloat);
    std::lock_guard<std::mutex> lock(mu);
    defined += buf.defined() ? 1 : 0;
  }, [](comm::WorldInfo&, comm::CommOptions& o) { o = small_slots(true); });
  unsetenv("DTRAIN_SYMMETRIC_BUFFERS");
  CHECK(defined == 0);
}

// symmetric_buffer.h: reduce_scatter whose input is a range of the
// symmetric buffer (ZeRO-2/3's inputs): every member's block read where it
// lies, async, more ops in flight than the segment has slots (64), every
// dtype, equal to the rank-order sum of the blocks exactly; the members'
// inputs are not written. Control: the same through Gloo's ring (shared
// memory off). Then: members passing different ranges throw on every member.
TEST_CASE("shm symmetric buffer: reduce_scatter read in place, every dtype, equal to the rank-order sum") {
  if (!have_dev_shm()) return;
  double worst = 0, gloo_vs_order = 0, inputs_changed = 0;
  int buffers = 0;
  std::mutex mu;
  each_world([&](comm::Comm& c, int r, int n, bool shm) {
    comm::Group& g = c.axis("dp");
    for (auto dt : {at::kFloat, at::kDouble, at::kInt, at::kLong}) {
      // 70 ops on 5 block sizes, each input at its own offset.
      const std::vector<int64_t> blocks = {1, 3, 1023, 1025, 5000};
      std::vector<std::pair<int64_t, int64_t>> ranges;  // (offset, block)
      int64_t total = 0;
      for (int k = 0; k < 70; ++k) {
        const int64_t m = blocks[size_t(k) % blocks.size()];
        ranges.emplace_back(total, m);
        total += n * m + (k % 3);
      }
      at::Tensor buf = comm::symmetric_buffer(g, total, dt);
      {
        std::lock_guard<std::mutex> lock(mu);
        buffers += buf.defined() ? 1 : 0;
      }
      if (!buf.defined()) buf = at::empty({total}, at::TensorOptions().dtype(dt));
      std::vector<comm::WorkPtr> works;
      std::vector<at::Tensor> outs;
      for (auto [off, m] : ranges) {
        at::Tensor in = buf.narrow(0, off, n * m);
        in.copy_(input(r + int(off % 5), n * m, dt));
        outs.push_back(at::empty({m}, at::TensorOptions().dtype(dt)));
        works.push_back(g.reduce_scatter(in, outs.back(), /*async=*/true));
      }
      for (auto& w : works) w->wait();
      double d = 0, changed = 0;
      for (size_t k = 0; k < ranges.size(); ++k) {
        auto [off, m] = ranges[k];
        at::Tensor want = input(int(off % 5), n * m, dt).narrow(0, r * m, m);
        for (int q = 1; q < n; ++q) want = want + input(q + int(off % 5), n * m, dt).narrow(0, r * m, m);
        d = std::max(d, max_diff(outs[k], want));
        changed = std::max(changed, max_diff(buf.narrow(0, off, n * m), input(r + int(off % 5), n * m, dt)));
      }
      std::lock_guard<std::mutex> lock(mu);
      if (shm) worst = std::max(worst, d), inputs_changed = std::max(inputs_changed, changed);
      else if (dt == at::kFloat) gloo_vs_order = std::max(gloo_vs_order, d);
    }
  });
  std::printf("shm symmetric buffer: %d buffers; reduce_scatter read in place vs the rank-order sum: max diff %.3g "
              "(tolerance 0, exact); inputs changed by %.3g; Gloo's ring fp32 vs the same: %.3g (must differ)\n",
              buffers, worst, inputs_changed, gloo_vs_order);
  CHECK(buffers == 4 * (2 + 3 + 4));  // every rank and dtype, with shared memory on
  CHECK(worst == 0);
  CHECK(inputs_changed == 0);
  CHECK(gloo_vs_order > 0);

  std::vector<std::string> messages;
  run_world(comm::parse_mesh("dp=2"), [&](comm::Comm& c, int r) {
    at::Tensor buf = comm::symmetric_buffer(c.axis("dp"), 100, at::kFloat);
    REQUIRE(buf.defined());
    at::Tensor in = buf.narrow(0, r == 0 ? 0 : 10, 20), out = at::empty({10}, at::kFloat);
    try {
      c.axis("dp").reduce_scatter(in, out);
    } catch (const dtrain::Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(e.what());
    }
  }, [](comm::WorldInfo&, comm::CommOptions& o) { o = small_slots(true); });
  REQUIRE(messages.size() == 2);
  for (const auto& m : messages) CHECK(m.find("different ranges") != std::string::npos);
}

// The shared sum (shm_symmetric.cpp): once every member has arrived, each
// adds up its 1/n of the range. The last member arrives last at every op
// (it issues op k only after the others have), so under the last-arriver
// protocol (DTRAIN_SHARED_SHM_SUM=0, the control) it sums every element
// alone; shared, each member sums about 1/n. Sums, maxes and
// reduce_scatters mixed on one buffer, more ops than slots (64), waited
// newest first; every result equal to the rank-order reduction, exactly,
// either way.
TEST_CASE("shm symmetric buffer: a sum's work shared by every member, whoever arrives last") {
  if (!have_dev_shm()) return;
  for (bool shared : {true, false}) {
    if (!shared) setenv("DTRAIN_SHARED_SHM_SUM", "0", 1);
    for (int n : {2, 3, 4}) {
      std::mutex mu;
      double worst = 0;
      std::vector<double> share(static_cast<size_t>(n));  // each member's part of the summed elements
      std::vector<std::atomic<int>> issued(90);            // members other than the last that issued op k
      run_world(comm::parse_mesh("dp=" + std::to_string(n)), [&](comm::Comm& c, int r) {
        comm::Group& g = c.axis("dp");
        const std::vector<int64_t> sizes = {1, 3, 1023, 1025, 10007, 40000};
        struct Op {
          int kind;  // 0 sum, 1 max, 2 reduce_scatter
          int64_t off, m;
        };
        std::vector<Op> ops;
        int64_t total = 0, sum_elems = 0;
        for (int k = 0; k < 90; ++k) {
          const int kind = k % 7 == 3 ? 2 : k % 7 == 5 ? 1 : 0;
          const int64_t m = sizes[size_t(k) % sizes.size()];
          ops.push_back({kind, total, m});
          total += (kind == 2 ? n * m : m) + (k % 3);
          if (kind == 0) sum_elems += m;
        }
        at::Tensor buf = comm::symmetric_buffer(g, total, at::kFloat);
        REQUIRE(buf.defined());
        const auto seg = comm::detail::symmetric_holding(g, buf);
        REQUIRE(seg);
        const int64_t before = comm::detail::symmetric_summed_elements(*seg);
        std::vector<comm::WorkPtr> works;
        std::vector<at::Tensor> outs;
        for (size_t k = 0; k < ops.size(); ++k) {
          const Op& o = ops[k];
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
          if (r == n - 1)
            while (issued[k].load() < n - 1) {
              if (std::chrono::steady_clock::now() > give_up) throw std::runtime_error("the others never issued op k");
              std::this_thread::yield();
            }
          if (o.kind == 2) {
            at::Tensor in = buf.narrow(0, o.off, n * o.m);
            in.copy_(input(r + int(k % 5), n * o.m, at::kFloat));
            outs.push_back(at::empty({o.m}, at::kFloat));
            works.push_back(g.reduce_scatter(in, outs.back(), /*async=*/true));
          } else {
            at::Tensor t = buf.narrow(0, o.off, o.m);
            t.copy_(input(r + int(k % 5), o.m, at::kFloat));
            outs.push_back(t);
            works.push_back(g.all_reduce(t, /*async=*/true, o.kind == 0 ? comm::ReduceOp::sum : comm::ReduceOp::max));
          }
          if (r != n - 1) issued[k].fetch_add(1);
        }
        for (auto w = works.rbegin(); w != works.rend(); ++w) (*w)->wait();
        double d = 0;
        for (size_t k = 0; k < ops.size(); ++k) {
          const Op& o = ops[k];
          const int64_t len = o.kind == 2 ? n * o.m : o.m;
          at::Tensor want = input(int(k % 5), len, at::kFloat);
          for (int q = 1; q < n; ++q) {
            at::Tensor x = input(q + int(k % 5), len, at::kFloat);
            want = o.kind == 1 ? at::maximum(want, x) : want + x;
          }
          if (o.kind == 2) want = want.narrow(0, r * o.m, o.m);
          d = std::max(d, max_diff(outs[k], want));
        }
        const double part = double(comm::detail::symmetric_summed_elements(*seg) - before) / double(sum_elems);
        std::lock_guard<std::mutex> lock(mu);
        worst = std::max(worst, d);
        share[size_t(r)] = part;
      }, [](comm::WorldInfo&, comm::CommOptions& o) { o = small_slots(true); });
      std::string parts;
      for (double p : share) parts += " " + std::to_string(p).substr(0, 5);
      std::printf("shm symmetric buffer, %s, dp=%d, the last member arriving last at all 90 ops: max diff %.3g vs "
                  "the rank-order reduction (tolerance 0); each member's part of the summed elements:%s\n",
                  shared ? "shared sum" : "last arriver sums (control)", n, worst, parts.c_str());
      CHECK(worst == 0);
      for (int r = 0; r < n; ++r) {
        if (shared) CHECK(std::abs(share[size_t(r)] - 1.0 / n) < 0.02);
        else CHECK(share[size_t(r)] == (r == n - 1 ? 1.0 : 0.0));
      }
    }
    unsetenv("DTRAIN_SHARED_SHM_SUM");
  }
}

TEST_CASE("shm shared buffer: one region every member reads and writes; none without shared memory") {
  if (!have_dev_shm()) return;
  std::mutex mu;
  double worst = 0;  // |read - written| over every member's view of every range
  int buffers = 0, undefined_without_shm = 0, worlds_without_shm = 0;
  int64_t own_only_mismatch = 0;  // negative control: a private buffer's foreign ranges keep their zeros
  each_world([&](comm::Comm& c, int r, int n, bool shm) {
    const int64_t per = 1025, total = per * n;  // [member 0's range | member 1's | ...]
    at::Tensor buf = comm::shared_buffer(c.axis("dp"), total, at::kFloat);
    const bool defined = buf.defined();
    if (!defined) buf = at::zeros({total}, at::TensorOptions().dtype(at::kFloat));
    buf.narrow(0, r * per, per).copy_(input(r, per, at::kFloat));  // this member's range only
    c.axis("dp").barrier();
    double d = 0;
    int64_t missing = 0;
    for (int q = 0; q < n; ++q) {
      const at::Tensor got = buf.narrow(0, q * per, per);
      d = std::max(d, max_diff(got, input(q, per, at::kFloat)));
      if (q != r) missing += (got == 0).sum().item<int64_t>();
    }
    c.axis("dp").barrier();  // nobody unmaps before everyone has read
    std::lock_guard<std::mutex> lock(mu);
    if (defined) {
      ++buffers;
      worst = std::max(worst, d);
    } else {
      own_only_mismatch += missing;
    }
    if (!shm) ++worlds_without_shm, undefined_without_shm += defined ? 0 : 1;
  });
  std::printf("shm shared buffer: %d buffers made; every member's view of every member's writes: max diff %.3g "
              "(tolerance 0); private buffers (no shared memory): %lld foreign elements still zero (must be > 0)\n",
              buffers, worst, static_cast<long long>(own_only_mismatch));
  CHECK(buffers == 2 + 3 + 4);
  CHECK(undefined_without_shm == worlds_without_shm);
  CHECK(worst == 0);
  CHECK(own_only_mismatch > 0);
}
