// engine/comm: every collective against its mathematical definition, at world
// sizes 2..5 run as threads of this process (one Comm per thread over a shared
// HashStore, Gloo on loopback), sizes that do not divide evenly, fp32, fp16
// and bf16; the per-axis groups of a dp=2,tp=2,pp=2 mesh; the env contract.
// Prints the max difference seen next to the tolerance.
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/zeros.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "engine/comm/comm.h"

#include "tests/support/thread_world.h"
#include "tests/support/torch_doctest.h"

namespace comm = dtrain::engine::comm;

namespace {

// Rank r's input of `numel` elements: smooth, different on every rank.
at::Tensor input(int r, int64_t numel, at::ScalarType dtype) {
  auto i = at::arange(numel, at::TensorOptions().dtype(at::kDouble));  // [numel]
  return ((i * 0.37 + r * 1.3).sin() * (r + 1)).to(dtype);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0;
  return (a.to(at::kDouble).reshape({-1}) - b.to(at::kDouble).reshape({-1})).abs().max().item().toDouble();
}

// Worst difference per (op, dtype) over every rank, size and world.
struct Diffs {
  std::mutex mu;
  std::map<std::string, double> worst;
  void add(const std::string& key, double d) {
    std::lock_guard<std::mutex> lock(mu);
    worst[key] = std::max(worst[key], d);
  }
};

// Changes a rank's WorldInfo and CommOptions before init_comm_with_store.
using Configure = dtrain::testing::ConfigureRank;
using dtrain::testing::run_world;

double tolerance(at::ScalarType dtype) {
  return dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 5e-2 : 5e-2;
}

const char* dtype_name(at::ScalarType d) {
  return d == at::kFloat ? "fp32" : d == at::kHalf ? "fp16" : "bf16";
}

// Every operation of one group, at one size and dtype, checked on rank r.
void check_ops(comm::Group& g, int64_t m, at::ScalarType dt, Diffs& diffs) {
  const int n = g.size(), r = g.rank();
  const std::string suffix = std::string(" ") + dtype_name(dt);
  std::vector<at::Tensor> x;  // every member's input, [n*m] each
  for (int q = 0; q < n; ++q) x.push_back(input(q, n * m, dt));
  at::Tensor sum = at::zeros({n * m}, at::kDouble);  // [n*m]
  for (auto& t : x) sum += t.to(at::kDouble);

  at::Tensor t = x[r].clone();
  g.all_reduce(t);
  diffs.add("all_reduce" + suffix, max_diff(t, sum));

  at::Tensor gathered = at::empty({n * n * m}, x[r].options());  // [n][n*m]
  g.all_gather(x[r], gathered);
  diffs.add("all_gather" + suffix, max_diff(gathered, at::cat(x)));

  at::Tensor out = at::full({m}, 99, x[r].options());  // [m]
  g.reset_bytes_sent();
  g.reduce_scatter(x[r], out);
  diffs.add("reduce_scatter" + suffix, max_diff(out, sum.narrow(0, r * m, m)));
  int64_t wire = dt == at::kBFloat16 ? 4 : x[r].element_size();
  CHECK(g.bytes_sent() == static_cast<uint64_t>((n - 1) * m * wire));

  at::Tensor b = x[r].clone();
  g.broadcast(b, n - 1);
  diffs.add("broadcast" + suffix, max_diff(b, x[n - 1]));

  // Uneven all-to-all of rows of 3: rank q sends (q + 2j + m) % 5 rows to j
  // (some zero), taken in order from the front of its input.
  auto rows = [&](int q, int j) { return static_cast<int64_t>((q + 2 * j + m) % 5); };
  std::vector<int64_t> in_splits(n), out_splits(n);
  std::vector<at::Tensor> expect;
  for (int j = 0; j < n; ++j) {
    in_splits[j] = rows(r, j);
    out_splits[j] = rows(j, r);
    int64_t before = 0;
    for (int k = 0; k < r; ++k) before += rows(j, k);
    expect.push_back(input(j, 3 * (before + rows(j, r)), dt).narrow(0, 3 * before, 3 * rows(j, r)));
  }
  int64_t in_rows = 0, out_rows = 0;
  for (int j = 0; j < n; ++j) in_rows += in_splits[j], out_rows += out_splits[j];
  at::Tensor a_in = input(r, 3 * in_rows, dt).view({in_rows, 3});  // [rows, 3]
  at::Tensor a_out = at::empty({out_rows, 3}, a_in.options());
  g.all_to_all(a_in, a_out, out_splits, in_splits);
  diffs.add("all_to_all" + suffix, max_diff(a_out, at::cat(expect)));

  // A ring of send/recv: each rank sends its input right, receives from the left.
  at::Tensor got = at::empty({n * m}, x[r].options());
  auto rw = g.recv(got, (r + n - 1) % n, 7);
  auto sw = g.send(x[r], (r + 1) % n, 7);
  sw->wait();
  rw->wait();
  diffs.add("send/recv" + suffix, max_diff(got, x[(r + n - 1) % n]));

  // Async: a reduce-scatter (our ring thread) and an all-reduce (Gloo's
  // threads) in flight together.
  at::Tensor t2 = x[r].clone(), out2 = at::empty({m}, x[r].options());
  auto w1 = g.reduce_scatter(x[r], out2, true);
  auto w2 = g.all_reduce(t2, true);
  w2->wait();
  w1->wait();
  diffs.add("async all_reduce" + suffix, max_diff(t2, sum));
  diffs.add("async reduce_scatter" + suffix, max_diff(out2, sum.narrow(0, r * m, m)));
  g.barrier();
}

void report(const char* title, Diffs& diffs) {
  std::printf("%s\n", title);
  for (auto& [key, d] : diffs.worst) {
    bool exact = key.find("all_gather") == 0 || key.find("broadcast") == 0 ||
                 key.find("all_to_all") == 0 || key.find("send") == 0;
    double tol = exact ? 0.0 : tolerance(key.find("fp32") != std::string::npos   ? at::kFloat
                                         : key.find("fp16") != std::string::npos ? at::kHalf
                                                                                 : at::kBFloat16);
    std::printf("  %-28s max diff %.3g (tolerance %.3g)\n", key.c_str(), d, tol);
    CHECK_MESSAGE(d <= tol, key, " max diff ", d, " > ", tol);
  }
}

}  // namespace

TEST_CASE("comm: every operation matches its definition at world 2..5") {
  // With shared memory on (the default) fp32 all_reduce, all_gather and
  // reduce_scatter go through it and the rest over Gloo; off, everything
  // takes Gloo (the ring reduce-scatter included).
  Diffs diffs;
  for (bool shm : {true, false})
    for (int n : {2, 3, 4, 5}) {
      dtrain::mesh::Mesh shape = dtrain::mesh::make_mesh(n, 1, 1);
      run_world(shape, [&](comm::Comm& c, int) {
        for (at::ScalarType dt : {at::kFloat, at::kHalf, at::kBFloat16})
          for (int64_t m : {1, 7, 4099, 20011}) {
            check_ops(c.world(), m, dt, diffs);
            if (m == 7) check_ops(c.axis("dp"), m, dt, diffs);  // shares the world's Gloo group
          }
      }, [shm](comm::WorldInfo&, comm::CommOptions& o) { o.shm = shm; });
    }
  report("comm collectives, world 2..5, chunk 1..20011, shared memory on and off, vs a float64 reference:",
         diffs);
}

TEST_CASE("comm: empty chunks and world of one") {
  Diffs diffs;
  for (int n : {1, 3}) {
    dtrain::mesh::Mesh shape = dtrain::mesh::make_mesh(n, 1, 1);
    run_world(shape, [&](comm::Comm& c, int) {
      auto& g = c.world();
      at::Tensor in = at::empty({0}), out = at::empty({0});
      g.reduce_scatter(in, out);
      at::Tensor t = at::full({5}, 2.0);
      g.all_reduce(t);
      diffs.add("n=" + std::to_string(n) + " all_reduce fp32", max_diff(t, at::full({5}, 2.0 * n)));
    });
  }
  report("comm: world 1 and empty reduce_scatter chunks:", diffs);
}

TEST_CASE("comm: ring reduce_scatter with chunks of many pipelined segments") {
  // Chunks over the ring's 256 KB segment: several segments per step, the
  // last one short, so the pipelined path (not just one segment) is checked.
  Diffs diffs;
  for (int n : {3, 4}) {
    dtrain::mesh::Mesh shape = dtrain::mesh::make_mesh(n, 1, 1);
    run_world(shape, [&](comm::Comm& c, int r) {
      auto& g = c.world();
      for (at::ScalarType dt : {at::kFloat, at::kHalf}) {
        const int64_t m = 200003;  // 781 KB fp32 per chunk
        at::Tensor sum = at::zeros({n * m}, at::kDouble);
        for (int q = 0; q < n; ++q) sum += input(q, n * m, dt).to(at::kDouble);
        at::Tensor out = at::empty({m}, input(r, 1, dt).options());
        g.reduce_scatter(input(r, n * m, dt), out);
        diffs.add(std::string("reduce_scatter ") + dtype_name(dt),
                  max_diff(out, sum.narrow(0, r * m, m)));
      }
    }, [](comm::WorldInfo&, comm::CommOptions& o) { o.shm = false; });  // the ring, not shared memory
  }
  report("comm: ring reduce_scatter, chunk 200003 (multi-segment), world 3 and 4:", diffs);
}

TEST_CASE("comm: per-axis groups of dp=2,tp=2,pp=2 follow common/mesh.h") {
  dtrain::mesh::Mesh shape = dtrain::mesh::make_mesh(2, 2, 2);
  std::mutex mu;
  std::map<std::string, std::vector<int>> of_rank5;
  Diffs diffs;
  run_world(shape, [&](comm::Comm& c, int r) {
    for (const char* axis : {"dp", "tp", "pp", "ep", "edp"}) {
      auto& g = c.axis(axis);
      dtrain::mesh::GroupKind kind{};
      REQUIRE(dtrain::mesh::parse_group(axis, &kind));
      CHECK(g.global_ranks() == dtrain::mesh::group_of(shape, kind, r));
      CHECK(g.global_ranks()[g.rank()] == r);
      if (r == 5) {
        std::lock_guard<std::mutex> lock(mu);
        of_rank5[axis] = g.global_ranks();
      }
      // Sum of the members' global ranks, over this axis only.
      at::Tensor t = at::full({3}, static_cast<float>(r));
      g.all_reduce(t);
      double expect = 0;
      for (int q : g.global_ranks()) expect += q;
      diffs.add(std::string(axis) + " all_reduce fp32", max_diff(t, at::full({3}, expect)));
      if (g.size() > 1 && std::string(axis) != "ep") check_ops(g, 5, at::kFloat, diffs);
    }
  });
  CHECK(of_rank5["tp"] == std::vector<int>{4, 5});
  CHECK(of_rank5["dp"] == std::vector<int>{5, 7});
  CHECK(of_rank5["pp"] == std::vector<int>{1, 5});
  CHECK(of_rank5["edp"] == std::vector<int>{4, 5, 6, 7});
  report("comm: axis groups of dp=2,tp=2,pp=2 (world 8):", diffs);
}

TEST_CASE("comm: WorldInfo::from_env names the missing or bad variable") {
  const char* vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "DTRAIN_MESH", "DTRAIN_COORD", "DTRAIN_RESTART"};
  for (auto v : vars) unsetenv(v);
  auto message = [] {
    try {
      comm::WorldInfo::from_env();
    } catch (const dtrain::Error& e) {
      CHECK(e.code() == dtrain::ErrorCode::config);
      return e.message();
    }
    return std::string("no error");
  };
  std::string m = message();
  CHECK(m.find("RANK is not set") != std::string::npos);
  CHECK(m.find("MASTER_PORT is not set") != std::string::npos);

  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "x29500", 1);
  setenv("DTRAIN_MESH", "dp=2,tp=2", 1);
  m = message();
  CHECK(m.find("MASTER_PORT=x29500") != std::string::npos);
  CHECK(m.find("dp(2) * tp(2) * pp(1) = 4 != WORLD_SIZE 8") != std::string::npos);

  setenv("MASTER_PORT", "29500", 1);
  setenv("DTRAIN_MESH", "tp=2,cp=1,dp=2,pp=2,ep=1", 1);  // axes innermost first
  setenv("DTRAIN_COORD", "tp=1,cp=0,dp=0,pp=1,ep=0", 1);
  auto w = comm::WorldInfo::from_env();
  CHECK(w.rank == 5);
  CHECK(w.coord[dtrain::mesh::Axis::tp] == 1);
  CHECK(w.coord[dtrain::mesh::Axis::pp] == 1);
  setenv("DTRAIN_COORD", "tp=0,cp=0,dp=0,pp=1,ep=0", 1);  // not rank 5's
  CHECK(message().find("DTRAIN_COORD=tp=0,cp=0,dp=0,pp=1,ep=0 but rank 5") != std::string::npos);
  unsetenv("DTRAIN_COORD");
  CHECK(w.local_rank == 5);
  setenv("DTRAIN_MESH", "dp=2,tp=2,zz=2", 1);
  CHECK(message().find("unknown axis 'zz'") != std::string::npos);
  for (auto v : vars) unsetenv(v);
}

TEST_CASE("comm: WorldInfo::from_env reads the resume point and the Gloo settings") {
  const char* vars[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DTRAIN_RESUME_FROM",
                        "GLOO_SOCKET_IFNAME"};
  for (auto v : vars) unsetenv(v);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  auto w = comm::WorldInfo::from_env();
  CHECK(w.resume_from.empty());
  CHECK(w.gloo_socket_ifname.empty());

  setenv("DTRAIN_RESUME_FROM", "/ckpt/step_20", 1);
  setenv("GLOO_SOCKET_IFNAME", "lo", 1);
  w = comm::WorldInfo::from_env();
  CHECK(w.resume_from == "/ckpt/step_20");
  CHECK(w.gloo_socket_ifname == "lo");
  for (auto v : vars) unsetenv(v);
}

TEST_CASE("comm: CommOptions::gloo_native_reduce_scatter runs Gloo's reduce-scatter, same result") {
  Diffs diffs;
  for (int n : {2, 3})
    run_world(
        comm::parse_mesh("dp=" + std::to_string(n)),
        [&](comm::Comm& c, int) {
          for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) check_ops(c.world(), 7, dt, diffs);
        },
        [](comm::WorldInfo&, comm::CommOptions& o) {
          o.gloo_native_reduce_scatter = true;
          o.shm = false;  // fp32 would take shared memory
        });
  report("comm: Gloo's native reduce-scatter (and the other ops beside it), world 2 and 3:", diffs);
}

TEST_CASE("comm: per-axis backends; unknown names, unknown axes and nccl without a GPU are refused") {
  // Named per axis, the groups are built on that backend (gloo: the only
  // one without a GPU) and work as the default ones do.
  Diffs diffs;
  run_world(
      comm::parse_mesh("dp=2,tp=2"),
      [&](comm::Comm& c, int) {
        for (const char* axis : {"dp", "tp"}) {
          CHECK(c.axis(axis).backend() == "gloo");
          check_ops(c.axis(axis), 5, at::kFloat, diffs);
        }
        CHECK(&c.control() == &c.world());  // the world is Gloo: it is the control group
      },
      [](comm::WorldInfo&, comm::CommOptions& o) { o.axis_backend = {{"dp", "gloo"}, {"tp", "gloo"}}; });
  report("comm: axis_backend dp=gloo, tp=gloo on dp=2,tp=2:", diffs);

  comm::WorldInfo info;
  info.mesh = comm::parse_mesh("dp=1");
  auto error_of = [&](const comm::CommOptions& o) {
    try {
      comm::init_comm_with_store(info, c10::make_intrusive<c10d::HashStore>(), o);
    } catch (const dtrain::Error& e) {
      CHECK(e.code() == dtrain::ErrorCode::config);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto has = [](const std::string& text, const std::string& part) {
    CHECK_MESSAGE(text.find(part) != std::string::npos, "missing '", part, "' in: ", text);
  };
  comm::CommOptions o;
  o.axis_backend = {{"tp", "mpi"}};
  std::string e = error_of(o);
  has(e, "axis tp: comm backend 'mpi' is unknown");
  has(e, "use gloo or nccl for axis tp");

  o.axis_backend = {{"zz", "gloo"}};
  e = error_of(o);
  has(e, "axis 'zz'");
  has(e, "tp, cp, dp, pp, dp_cp, ep and edp");

  o.axis_backend = {};
  o.backend = "mpi";
  has(error_of(o), "cluster.backend: comm backend 'mpi' is unknown");

  // nccl for one axis, with the tensors on the CPU: refused before any group
  // connects, naming the axis and the way out, in CPU and CUDA builds alike.
  o.backend = "gloo";
  o.axis_backend = {{"dp", "nccl"}};
  e = error_of(o);
  has(e, "axis dp = nccl");
  has(e, comm::nccl_available() ? "needs CUDA tensors, the device is cpu" : "has no NCCL");
  has(e, "gloo for axis dp");
}

TEST_CASE("comm: all_reduce max and min, fp32 and bf16, world 3") {
  for (auto dt : {at::kFloat, at::kBFloat16})
    run_world(comm::parse_mesh("dp=3"), [dt](comm::Comm& c, int r) {
      std::vector<at::Tensor> x;
      for (int q = 0; q < 3; ++q) x.push_back(input(q, 257, dt));
      at::Tensor mx = x[0].clone(), mn = x[0].clone();
      for (int q = 1; q < 3; ++q) {
        mx = at::maximum(mx, x[q]);
        mn = at::minimum(mn, x[q]);
      }
      at::Tensor a = x[r].clone(), b = x[r].clone();
      c.world().all_reduce(a, /*async=*/false, comm::ReduceOp::max);
      c.axis("dp").all_reduce(b, /*async=*/false, comm::ReduceOp::min);
      // max and min pick one of the inputs: exact in every dtype
      CHECK(max_diff(a, mx) == 0);
      CHECK(max_diff(b, mn) == 0);
      CHECK(max_diff(mx, mn) > 0);  // the inputs differ, so the check can fail
    });
}

namespace {

// A backend that has only the ops every backend must have: the others come
// from comm::Group and must refuse, naming the backend and the op.
class MinimalGroup : public comm::Group {
 public:
  const std::string& name() const override { return name_; }
  const std::string& backend() const override { return backend_; }
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& global_ranks() const override { return ranks_; }
  comm::WorkPtr all_reduce(at::Tensor&, bool, comm::ReduceOp) override { return nullptr; }
  comm::WorkPtr all_gather(const at::Tensor&, at::Tensor&, bool) override { return nullptr; }
  comm::WorkPtr broadcast(at::Tensor&, int, bool) override { return nullptr; }
  void barrier() override {}
  uint64_t bytes_sent() const override { return 0; }
  void reset_bytes_sent() override {}

 private:
  std::string name_ = "dp", backend_ = "minimal";
  std::vector<int> ranks_{0};
};

}  // namespace

TEST_CASE("comm: an op a backend lacks throws naming the backend and the op") {
  MinimalGroup g;
  at::Tensor t = at::zeros({4}), out = at::zeros({4});
  auto expect = [](const std::function<void()>& call, const std::string& op) {
    try {
      call();
      FAIL("no error for " << op);
    } catch (const dtrain::Error& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.find("backend minimal lacks " + op + " (group dp)") != std::string::npos, what);
    }
  };
  expect([&] { g.reduce_scatter(t, out); }, "reduce_scatter");
  expect([&] { g.all_to_all(t, out, {4}, {4}); }, "all_to_all");
  expect([&] { g.send(t, 0); }, "send");
  expect([&] { g.recv(t, 0); }, "recv");
}
