// Unit tests of AdamW with its moments offloaded (engine/optim/offload_store.h):
// nvme and host against the in-memory AdamW, bit for bit, with buckets that
// cut parameters apart (max difference printed; control: writes dropped);
// the moments read out for a checkpoint and written back; the file's
// removal; a truncated or deleted file as an error naming it.
#include "engine/optim/adamw.h"

#include <ATen/ATen.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"

using dtrain::engine::optim::AdamW;
using dtrain::engine::optim::AdamWOptions;
using dtrain::engine::optim::OffloadOptions;
namespace fs = std::filesystem;

namespace {

struct Pair {
  std::vector<at::Tensor> a, b;  // the same start values
};

Pair make_params() {
  auto gen = at::detail::createCPUGenerator(5);
  Pair p;
  for (auto shape : {std::vector<int64_t>{7, 5}, {5}, {3, 4}, {1}}) {
    at::Tensor t = at::randn(shape, gen, at::kFloat);
    p.a.push_back(t.clone().requires_grad_());
    p.b.push_back(t.clone().requires_grad_());
  }
  return p;
}

std::string temp_file(const std::string& name) {
  return (fs::temp_directory_path() / ("dtrain-offload-unit-" + std::to_string(::getpid()) + "-" + name)).string();
}

// Steps both optimizers with the same gradients; the largest parameter difference.
double run_steps(AdamW& plain, AdamW& off, Pair& p, int steps, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  for (int t = 0; t < steps; ++t) {
    for (size_t i = 0; i < p.a.size(); ++i) {
      at::Tensor g = at::randn(p.a[i].sizes(), gen, at::kFloat);
      p.a[i].mutable_grad() = g.clone();
      p.b[i].mutable_grad() = g.clone();
    }
    plain.step(1e-2);
    off.step(1e-2);
  }
  double worst = 0;
  for (size_t i = 0; i < p.a.size(); ++i) worst = std::max(worst, (p.a[i] - p.b[i]).abs().max().item<double>());
  return worst;
}

OffloadOptions nvme_options(const std::string& file, int64_t bucket) {
  OffloadOptions o;
  o.nvme = true;
  o.file = file;
  o.bucket_floats = bucket;
  return o;
}

}  // namespace

TEST_CASE("offloaded AdamW (nvme and host, buckets across parameters) equals the in-memory one bit for bit") {
  const std::vector<bool> decay = {true, false, true, false};
  for (bool nvme : {true, false})
    for (int64_t bucket : {1, 7, 13, 1000}) {
      Pair p = make_params();
      AdamW plain(p.a, decay, AdamWOptions{});
      AdamW off(p.b, decay, AdamWOptions{});
      const std::string file = temp_file("parity");
      OffloadOptions o = nvme_options(file, bucket);
      o.nvme = nvme;
      off.offload(o, /*prefetch=*/bucket != 13);
      const double diff = run_steps(plain, off, p, 5, 11);
      MESSAGE((nvme ? "nvme" : "host") << " bucket " << bucket << ": max param diff " << diff << " (tol 0)");
      CHECK(diff == 0.0);
      CHECK(off.offloaded_bytes() == 8 * (35 + 5 + 12 + 1));
      CHECK(fs::exists(file) == nvme);
    }
}

TEST_CASE("offloaded AdamW: control (writes dropped) differs; the file is removed with the optimizer") {
  const std::vector<bool> decay = {true, false, true, false};
  Pair p = make_params();
  AdamW plain(p.a, decay, AdamWOptions{});
  const std::string file = temp_file("control");
  {
    AdamW off(p.b, decay, AdamWOptions{});
    OffloadOptions o = nvme_options(file, 7);
    o.drop_writes = true;
    off.offload(o, true);
    const double diff = run_steps(plain, off, p, 5, 11);
    MESSAGE("writes dropped: max param diff " << diff << " (must be >= 1e-3)");
    CHECK(diff >= 1e-3);
    CHECK(fs::exists(file));
  }
  CHECK(!fs::exists(file));
}

TEST_CASE("offloaded AdamW: moments read out for a checkpoint, changed, and written back by the next step") {
  const std::vector<bool> decay = {true, false, true, false};
  Pair p = make_params();
  AdamW plain(p.a, decay, AdamWOptions{});
  AdamW off(p.b, decay, AdamWOptions{});
  off.offload(nvme_options(temp_file("ckpt"), 7), true);
  run_steps(plain, off, p, 3, 21);
  CHECK(off.resident_bytes() < 2 * 2 * 7 * 4 + 1);  // two staging buckets
  double diff = 0;
  for (size_t i = 0; i < p.a.size(); ++i) {
    diff = std::max(diff, (plain.exp_avg()[i] - off.exp_avg()[i]).abs().max().item<double>());
    diff = std::max(diff, (plain.exp_avg_sq()[i] - off.exp_avg_sq()[i]).abs().max().item<double>());
  }
  MESSAGE("moments read out after 3 steps: max diff " << diff);
  CHECK(diff == 0.0);
  // A load writes into them: halve both optimizers' first moments.
  for (size_t i = 0; i < p.a.size(); ++i) {
    plain.exp_avg()[i].mul_(0.5);
    off.exp_avg()[i].mul_(0.5);
  }
  const double after = run_steps(plain, off, p, 3, 22);
  MESSAGE("after the moments were changed and 3 more steps: max param diff " << after);
  CHECK(after == 0.0);
  CHECK(off.resident_bytes() < 2 * 2 * 7 * 4 + 1);  // dropped again by the step
}

TEST_CASE("offloaded AdamW: a truncated or deleted file is an error naming it") {
  const std::vector<bool> decay = {true, false, true, false};
  for (bool truncate : {true, false}) {
    Pair p = make_params();
    AdamW plain(p.a, decay, AdamWOptions{});
    AdamW off(p.b, decay, AdamWOptions{});
    const std::string file = temp_file(truncate ? "trunc" : "del");
    off.offload(nvme_options(file, 7), true);
    run_steps(plain, off, p, 1, 31);
    off.offload_store()->drain();
    if (truncate)
      fs::resize_file(file, 40);
    else
      fs::remove(file);
    std::string what;
    try {
      run_steps(plain, off, p, 1, 32);
    } catch (const dtrain::Error& e) {
      what = e.what();
    }
    MESSAGE((truncate ? "truncated: " : "deleted: ") << what);
    CHECK(what.find(file) != std::string::npos);
    CHECK(what.find(truncate ? "was truncated" : "was deleted") != std::string::npos);
  }
}
