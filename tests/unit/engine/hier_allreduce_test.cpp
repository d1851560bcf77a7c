// engine/comm's hierarchical all-reduce (hier_group.h) on ranks as threads
// of this process, with WorldInfo::node_rank splitting them into "nodes" (a
// segment is never shared across nodes, so the world group spans them):
// 2 nodes x 2, 2 x 3 and an uneven 2 + 1. The sum is the per-node sum in
// member order plus the other node's (two leaders: Gloo adds one pair, which
// commutes), so it equals that reference exactly; flat Gloo (hierarchical
// off, the negative control) adds in its ring's order and differs. Also: the
// shared-memory broadcast it ends with, async ops, ops it leaves to Gloo, and
// the in-place path on a symmetric buffer of the node.
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <mutex>

#include <unistd.h>

#include "common/error.h"
#include "engine/comm/comm.h"
#include "engine/comm/symmetric_buffer.h"

#include "tests/support/thread_world.h"
#include "tests/support/torch_doctest.h"
// After torch_doctest.h: doctest's CHECK, not glog's.
#include "tests/support/skip.h"

namespace comm = dtrain::engine::comm;
using dtrain::testing::run_world;

namespace {

at::Tensor hier_input(int r, int64_t numel, at::ScalarType dtype) {
  auto i = at::arange(numel, at::TensorOptions().dtype(at::kDouble));  // [numel]
  auto x = (i * 0.37 + r * 1.3).sin() * (r + 1) * 1000.0;
  return (dtype == at::kFloat || dtype == at::kDouble) ? (x / 7.0).to(dtype) : x.to(dtype);
}

double hier_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item().toDouble();
}

struct Layout {
  int n;
  std::vector<int> node_of;  // by rank
};

const std::vector<Layout> kLayouts = {{4, {0, 0, 1, 1}}, {6, {0, 0, 0, 1, 1, 1}}, {3, {0, 0, 1}}};

// Node 0's members summed in rank order, plus node 1's: what the
// hierarchical path must produce exactly (two leaders).
at::Tensor two_node_reference(const Layout& l, int64_t m, at::ScalarType dt) {
  at::Tensor sums[2];
  for (int r = 0; r < l.n; ++r) {
    at::Tensor& s = sums[l.node_of[static_cast<size_t>(r)]];
    s = s.defined() ? s + hier_input(r, m, dt) : hier_input(r, m, dt);
  }
  return sums[0] + sums[1];
}

bool have_dev_shm() {
  if (access("/dev/shm", W_OK) == 0) return true;
  dtrain::testing::skip_case(dtrain::testing::SkipKind::dev_shm,
                             "/dev/shm is not writable here, so no group sums through shared memory");
  return false;
}

// body(comm, rank, layout) on dp = layout.n with the layout's nodes, the
// hierarchical all-reduce on or off.
void each_layout(bool hierarchical, const std::function<void(comm::Comm&, int, const Layout&)>& body) {
  for (const Layout& l : kLayouts)
    run_world(comm::parse_mesh("dp=" + std::to_string(l.n)), [&](comm::Comm& c, int r) { body(c, r, l); },
              [&](comm::WorldInfo& info, comm::CommOptions& o) {
                info.node_rank = l.node_of[static_cast<size_t>(info.rank)];
                o.shm_slot_bytes = 4096;  // 1024 fp32: most sizes below take several chunks
                o.hierarchical = hierarchical;
              });
}

}  // namespace

TEST_CASE("hierarchical all_reduce across 2 nodes: the per-node sums added, exactly; flat Gloo differs") {
  if (!have_dev_shm()) return;
  double worst = 0, flat_vs_order = 0;
  std::string paths[2];
  std::mutex mu;
  for (bool hier : {true, false})
    each_layout(hier, [&](comm::Comm& c, int r, const Layout& l) {
      {
        std::lock_guard<std::mutex> lock(mu);
        paths[hier] += " " + c.axis("dp").path() + " " + c.world().path();
      }
      for (auto dt : {at::kFloat, at::kDouble, at::kInt, at::kLong})
        for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{1023}, int64_t{1025}, int64_t{10007}}) {
          at::Tensor t = hier_input(r, m, dt);
          c.axis("dp").all_reduce(t);
          const double d = hier_diff(t, two_node_reference(l, m, dt));
          std::lock_guard<std::mutex> lock(mu);
          if (hier) worst = std::max(worst, d);
          else if (dt == at::kFloat) flat_vs_order = std::max(flat_vs_order, d);
        }
    });
  std::printf("hierarchical all_reduce vs node-order sums: max diff %.3g (tolerance 0, exact); "
              "flat Gloo fp32 vs the same: %.3g (must differ)\n", worst, flat_vs_order);
  CHECK(paths[1].find(" gloo") == std::string::npos);  // every group took the hierarchical path...
  CHECK(paths[1].find("shm+gloo") != std::string::npos);
  CHECK(paths[0].find("shm+gloo") == std::string::npos);  // ...and none with it off
  CHECK(worst == 0);
  CHECK(flat_vs_order > 0);
}

TEST_CASE("hierarchical all_reduce: async ops finish in call order; max and bf16 go to Gloo; broadcast") {
  if (!have_dev_shm()) return;
  double worst = 0;
  std::mutex mu;
  each_layout(true, [&](comm::Comm& c, int r, const Layout& l) {
    comm::Group& g = c.axis("dp");
    std::vector<at::Tensor> ts;
    std::vector<comm::WorkPtr> works;
    for (int64_t m : {int64_t{5000}, int64_t{17}, int64_t{3000}}) {
      ts.push_back(hier_input(r, m, at::kFloat));
      works.push_back(g.all_reduce(ts.back(), /*async=*/true));
    }
    at::Tensor mx = hier_input(r, 1500, at::kFloat);  // sync, between the async ones
    g.all_reduce(mx, false, comm::ReduceOp::max);
    at::Tensor ref_max = hier_input(0, 1500, at::kFloat);
    for (int q = 1; q < l.n; ++q) ref_max = at::maximum(ref_max, hier_input(q, 1500, at::kFloat));
    at::Tensor b = hier_input(r, 2500, at::kFloat);  // through the node's segment (2500 > a slot)
    g.broadcast(b, 1);
    double d = std::max(hier_diff(mx, ref_max), hier_diff(b, hier_input(1, 2500, at::kFloat)));
    for (size_t k = 0; k < works.size(); ++k) {
      works[k]->wait();
      d = std::max(d, hier_diff(ts[k], two_node_reference(l, ts[k].numel(), at::kFloat)));
    }
    at::Tensor bf = hier_input(r, 64, at::kFloat).to(at::kBFloat16);
    g.all_reduce(bf);  // Gloo (through fp32): close, not exact
    at::Tensor ref_bf = two_node_reference(l, 64, at::kFloat).to(at::kBFloat16);
    d = std::max(d, hier_diff(bf, ref_bf) > 0.05 * ref_bf.abs().max().item().toDouble() ? 1e9 : 0.0);
    std::lock_guard<std::mutex> lock(mu);
    worst = std::max(worst, d);
  });
  std::printf("hierarchical async all_reduce, Gloo max, broadcast: max diff %.3g (tolerance 0)\n", worst);
  CHECK(worst == 0);
}

TEST_CASE("shm broadcast: chunked, every root and dtype, equal to the root's tensor") {
  if (!have_dev_shm()) return;
  double worst = 0;
  std::mutex mu;
  for (int n : {2, 3})
    run_world(comm::parse_mesh("dp=" + std::to_string(n)), [&](comm::Comm& c, int r) {
      REQUIRE(c.axis("dp").path() == "shm");
      for (auto dt : {at::kFloat, at::kDouble, at::kInt, at::kLong})
        for (int root = 0; root < n; ++root)
          for (int64_t m : {int64_t{1}, int64_t{1025}, int64_t{10007}}) {
            at::Tensor t = hier_input(r, m, dt);
            c.axis("dp").broadcast(t, root);
            const double d = hier_diff(t, hier_input(root, m, dt));
            std::lock_guard<std::mutex> lock(mu);
            worst = std::max(worst, d);
          }
    }, [&](comm::WorldInfo&, comm::CommOptions& o) { o.shm_slot_bytes = 4096; });
  std::printf("shm broadcast vs the root's tensor: max diff %.3g (tolerance 0, exact)\n", worst);
  CHECK(worst == 0);
}

// symmetric_buffer.h on a group that spans nodes: a symmetric buffer of the
// node's members (none on a node of one member: the 2 + 1 layout's rank 2
// keeps a private tensor, and its staged path meets the others' in place
// path in the leaders' Gloo stage). Ranges of it all-reduced, sync and async,
// every dtype, equal to the node-order sums exactly, and what lies between
// the ranges untouched. Control: members of a node passing different ranges
// (only the in-place path compares them) throw on that node's members.
TEST_CASE("hierarchical all_reduce on a symmetric buffer: both node stages in place, exact; ranges checked") {
  if (!have_dev_shm()) return;
  double worst = 0, untouched = 0;
  int buffers = 0, expected_buffers = 0, mismatch_errors = 0, expected_errors = 0;
  std::mutex mu;
  each_layout(true, [&](comm::Comm& c, int r, const Layout& l) {
    comm::Group& g = c.axis("dp");
    const int node = l.node_of[size_t(r)];
    const int members = int(std::count(l.node_of.begin(), l.node_of.end(), node));
    const int local = int(std::count(l.node_of.begin(), l.node_of.begin() + r, node));
    for (auto dt : {at::kFloat, at::kDouble, at::kInt, at::kLong}) {
      const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 1}, {3, 1023}, {1100, 10007}, {11200, 5}};
      const int64_t total = 12000;
      at::Tensor buf = comm::symmetric_buffer(g, total, dt);
      {
        std::lock_guard<std::mutex> lock(mu);
        buffers += buf.defined() ? 1 : 0;
        expected_buffers += members > 1 ? 1 : 0;
      }
      if (!buf.defined()) buf = at::empty({total}, at::TensorOptions().dtype(dt));
      buf.fill_(-7);
      std::vector<comm::WorkPtr> works;
      for (size_t k = 0; k < ranges.size(); ++k) {
        auto [off, m] = ranges[k];
        at::Tensor t = buf.narrow(0, off, m);
        t.copy_(hier_input(r, m, dt));
        works.push_back(g.all_reduce(t, /*async=*/k % 2 == 1));
      }
      for (auto& w : works) w->wait();
      double d = 0;
      for (auto [off, m] : ranges) d = std::max(d, hier_diff(buf.narrow(0, off, m), two_node_reference(l, m, dt)));
      // Between the ranges: still -7 on every member.
      const double gap = std::max(hier_diff(buf.narrow(0, 1, 2), at::full({2}, -7, buf.options())),
                                  hier_diff(buf.narrow(0, 11205, total - 11205),
                                            at::full({total - 11205}, -7, buf.options())));
      std::lock_guard<std::mutex> lock(mu);
      worst = std::max(worst, d);
      untouched = std::max(untouched, gap);
    }
    // A node's second member 10 elements off: that node's members throw.
    at::Tensor buf = comm::symmetric_buffer(g, 100, at::kFloat);
    if (!buf.defined()) buf = at::zeros({100}, at::kFloat);
    at::Tensor t = buf.narrow(0, local == 1 ? 10 : 0, 20);
    bool threw = false;
    try {
      g.all_reduce(t);
    } catch (const dtrain::Error& e) {
      threw = std::string(e.what()).find("different ranges") != std::string::npos;
    }
    std::lock_guard<std::mutex> lock(mu);
    mismatch_errors += threw ? 1 : 0;
    expected_errors += members > 1 ? 1 : 0;
  });
  std::printf("hierarchical all_reduce on symmetric buffers: %d of %d members with 2+ on their node got one; vs "
              "node-order sums: max diff %.3g (tolerance 0, exact); between the ranges: max diff %.3g; different "
              "ranges on a node: %d of %d members threw\n",
              buffers, expected_buffers, worst, untouched, mismatch_errors, expected_errors);
  CHECK(buffers == expected_buffers);
  CHECK(worst == 0);
  CHECK(untouched == 0);
  CHECK(mismatch_errors == expected_errors);
}
