// engine/comm on NCCL (CUDA builds; needs a GPU, skipped with the reason
// otherwise): one rank on GPU 0 (NCCL refuses two ranks on one GPU), every op
// in fp32 and bf16 against the same op on the CPU through Gloo, plus the
// control group staying Gloo on the CPU. Prints the max difference seen.
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "engine/comm/comm.h"
#include "engine/device/device.h"

#include "tests/support/torch_doctest.h"
// After torch_doctest.h: doctest's CHECK, not glog's.
#include "tests/support/skip.h"

namespace comm = dtrain::engine::comm;
namespace device = dtrain::engine::device;

namespace {

bool have_gpu() {
  if (!comm::nccl_available()) {
    dtrain::testing::skip_case(dtrain::testing::SkipKind::cuda_libtorch,
                               "this LibTorch has no CUDA, so dtrain has no NCCL backend");
    return false;
  }
  if (device::cuda_device_count() == 0) {
    dtrain::testing::skip_case(dtrain::testing::SkipKind::gpu,
                               "no GPU visible (NCCL cases run on a machine with one: scripts/gpu-check)");
    return false;
  }
  return true;
}

std::unique_ptr<comm::Comm> one_rank(const std::string& backend, c10::Device d) {
  comm::WorldInfo info;
  info.mesh = comm::parse_mesh("dp=1");
  comm::CommOptions o;
  o.backend = backend;
  o.device = d;
  o.timeout_s = 60;
  return comm::init_comm_with_store(info, c10::make_intrusive<c10d::HashStore>(), o);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.cpu().to(at::kDouble) - b.cpu().to(at::kDouble)).abs().max().item().toDouble();
}

}  // namespace

TEST_CASE("nccl: every op on one GPU matches the same op on the CPU (Gloo)") {
  if (!have_gpu()) return;
  const c10::Device gpu = device::select("cuda", 0, 1);
  auto nccl = one_rank("nccl", gpu);
  auto gloo = one_rank("gloo", c10::Device(c10::DeviceType::CPU));
  CHECK(nccl->world().backend() == "nccl");
  CHECK(nccl->control().backend() == "gloo");
  CHECK(nccl->control().device().is_cpu());
  double worst = 0;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor x = (at::arange(4099, at::TensorOptions().dtype(at::kDouble)) * 0.37).sin().to(dtype);
    auto both = [&](auto op) {
      at::Tensor c = x.clone(), g = x.to(gpu);
      at::Tensor co = op(gloo->world(), c), go = op(nccl->world(), g);
      device::synchronize(gpu);
      CHECK(go.device() == gpu);
      worst = std::max(worst, max_diff(co, go));
    };
    both([](comm::Group& grp, at::Tensor& t) { grp.all_reduce(t); return t; });
    both([](comm::Group& grp, at::Tensor& t) { grp.broadcast(t, 0); return t; });
    both([](comm::Group& grp, at::Tensor& t) {
      at::Tensor out = at::empty_like(t);
      grp.all_gather(t, out);
      return out;
    });
    both([](comm::Group& grp, at::Tensor& t) {
      at::Tensor out = at::empty_like(t);
      grp.reduce_scatter(t, out);
      return out;
    });
    both([](comm::Group& grp, at::Tensor& t) {
      at::Tensor in = t.view({-1, 1}), out = at::empty_like(in);
      grp.all_to_all(in, out, {in.size(0)}, {in.size(0)});
      return out;
    });
  }
  nccl->world().barrier();
  nccl->control().barrier();
  MESSAGE("nccl vs gloo, 1 rank, fp32 and bf16, 5 ops: max abs diff " << worst << " (must be 0)");
  CHECK(worst == 0);
}

TEST_CASE("nccl: per-axis backends mix NCCL and Gloo groups in one Comm") {
  if (!have_gpu()) return;
  const c10::Device gpu = device::select("cuda", 0, 1);
  const c10::Device cpu(c10::DeviceType::CPU);
  comm::WorldInfo info;
  info.mesh = comm::parse_mesh("dp=1");
  // The data backend Gloo with dp on NCCL, and the reverse with tp on Gloo.
  for (const std::string world_backend : {"gloo", "nccl"}) {
    CAPTURE(world_backend);
    comm::CommOptions o;
    o.backend = world_backend;
    o.device = gpu;
    o.timeout_s = 60;
    const std::string other = world_backend == "gloo" ? "nccl" : "gloo";
    const std::string axis = world_backend == "gloo" ? "dp" : "tp";
    o.axis_backend = {{axis, other}};
    auto c = comm::init_comm_with_store(info, c10::make_intrusive<c10d::HashStore>(), o);
    CHECK(c->world().backend() == world_backend);
    CHECK(c->axis(axis).backend() == other);
    CHECK(c->control().backend() == "gloo");
    for (const char* a : {"dp", "tp", "pp", "ep", "edp"}) {
      comm::Group& g = c->axis(a);
      CHECK(g.device() == (g.backend() == "nccl" ? gpu : cpu));
      at::Tensor t = at::arange(5, at::TensorOptions().dtype(at::kFloat)).to(g.device());
      g.all_reduce(t);  // one rank: unchanged
      device::synchronize(gpu);
      CHECK(max_diff(t, at::arange(5, at::TensorOptions().dtype(at::kFloat))) == 0);
    }
    c->control().barrier();
  }
}
