// engine/checkpoint in one process (world 1 over a HashStore): save writes
// the atomic layout; load restores parameters, AdamW state, step count,
// sampler position and the CPU RNG stream bit for bit; a checkpoint of
// another model is refused with the tensor and both shapes.
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/ops/empty_like.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn_like.h>
#include <c10/core/GradMode.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/error.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/parallel/parallelize.h"
#include "engine/model/gpt.h"

#include "tests/support/torch_doctest.h"

namespace {

namespace fs = std::filesystem;
using namespace dtrain::engine;

struct Rig {
  dtrain::JobSpec spec;
  comm::WorldInfo info;
  std::unique_ptr<comm::Comm> comm;
  parallel::Parallelized par;  // DDP over dp = 1: the replicated layout's checkpoint view
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<parallel::StateProvider> provider;
  std::unique_ptr<data::DistributedSampler> sampler;
  optim::LrSchedule schedule;

  Rig(const std::string& dir, int d_model, const c10::intrusive_ptr<c10d::Store>& store) {
    spec.model.d_model = d_model;
    spec.model.layers = 1;
    spec.model.heads = 2;
    spec.model.seq_len = 8;
    spec.checkpoint.dir = dir;
    spec.checkpoint.keep = 2;
    comm = comm::init_comm_with_store(info, store);
    model::GptConfig c;
    c.d_model = d_model;
    c.layers = 1;
    c.heads = 2;
    c.seq_len = 8;
    par = parallel::parallelize(spec, *comm, model::Gpt(c, 1234));
    params = par.parts.named_params;
    auto o = par.grad_sync->optimizer_params();
    opt = std::make_unique<optim::AdamW>(o.params, std::vector<bool>(o.params.size(), true),
                                         optim::AdamWOptions{});
    provider = par.grad_sync->state(*opt);
    sampler = std::make_unique<data::DistributedSampler>(100, 1, 1, 0, 4, 1);
  }
  checkpoint::TrainState state() {
    return {&spec, &info, &comm->control(), provider.get(), opt.get(), sampler.get(), &schedule};
  }
  void train_a_bit(int steps) {
    for (int i = 0; i < steps; ++i) {
      for (auto& [n, p] : params) p.mutable_grad().copy_(at::randn_like(p));  // grads are bucket views
      opt->step(1e-3);
      sampler->advance();
    }
  }
};

}  // namespace

TEST_CASE("engine checkpoint: save, then load restores everything bit for bit") {
  const std::string dir = fs::temp_directory_path() / ("dtrain-ckpt-engine-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto store = c10::make_intrusive<c10d::HashStore>();
  Rig rig(dir, 16, store);
  rig.train_a_bit(3);
  auto stats = checkpoint::save(rig.state(), 3);
  CHECK(stats.dir == dir + "/step_3");
  CHECK(fs::exists(dir + "/step_3/index.json"));
  CHECK(fs::exists(dir + "/step_3/rank_0.safetensors"));
  CHECK(!fs::exists(dir + "/step_3.tmp"));
  CHECK(checkpoint::prepare_resume(rig.state()) == dir + "/step_3");

  // What must come back: params, AdamW state, the next random numbers.
  std::vector<at::Tensor> p0, m0, v0;
  for (auto& [n, p] : rig.params) p0.push_back(p.detach().clone());
  for (auto& t : rig.opt->exp_avg()) m0.push_back(t.clone());
  for (auto& t : rig.opt->exp_avg_sq()) v0.push_back(t.clone());
  at::Tensor r0 = at::rand({16});

  rig.train_a_bit(2);  // move everything on, RNG included
  at::manual_seed(999);
  CHECK(checkpoint::load(rig.state(), dir + "/step_3") == 3);
  CHECK(rig.opt->step_count() == 3);
  CHECK(rig.sampler->state().consumed == 12);
  for (size_t i = 0; i < p0.size(); ++i) {
    CAPTURE(rig.params[i].first);
    CHECK(at::equal(rig.params[i].second, p0[i]));
    CHECK(at::equal(rig.opt->exp_avg()[i], m0[i]));
    CHECK(at::equal(rig.opt->exp_avg_sq()[i], v0[i]));
  }
  CHECK(at::equal(at::rand({16}), r0));

  // Another model (d_model 32) refuses this checkpoint.
  auto store2 = c10::make_intrusive<c10d::HashStore>();
  Rig other(dir, 32, store2);
  try {
    checkpoint::load(other.state(), dir + "/step_3");
    FAIL("loading a d_model 16 checkpoint into d_model 32 did not throw");
  } catch (const dtrain::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(e.code() == dtrain::ErrorCode::checkpoint);
    CHECK(msg.find("tensor model/wte.weight is F32 [256, 16] in the checkpoint but F32 [256, 32] in the model") !=
          std::string::npos);
  }
  fs::remove_all(dir);
}

// take_snapshot's host copies (checkpoint.cpp's pool): taken in the
// background for a state that stays put until the optimizer, they never
// alias the live state, hold the state as of the snapshot once
// wait_for_host_copies returns, and a set no save or copy holds any more is
// written again instead of a new one allocated.
TEST_CASE("engine checkpoint: snapshot copies are the state of their step and reuse freed buffers") {
  const std::string dir = fs::temp_directory_path() / ("dtrain-ckpt-snap-" + std::to_string(::getpid()));
  auto store = c10::make_intrusive<c10d::HashStore>();
  Rig rig(dir, 16, store);
  rig.train_a_bit(1);
  const auto first_param = [&](const checkpoint::detail::PreparedSave& p) {
    for (size_t i = 0; i < p.shards.size(); ++i)
      if (p.shards[i].entry.name == "model/" + rig.params[0].first) return p.keep[i];
    FAIL("no model/" << rig.params[0].first << " in the snapshot");
    return at::Tensor();
  };
  const at::Tensor live = rig.params[0].second;
  auto a = checkpoint::detail::take_snapshot(rig.state(), 1);
  CHECK(a.copied.valid());  // DDP's state stays put until the optimizer: copied while the next step runs
  checkpoint::wait_for_host_copies();  // what the trainer does before the state changes
  at::Tensor a0 = first_param(a);
  CHECK(a0.data_ptr() != live.data_ptr());
  CHECK(at::equal(a0, live));
  const at::Tensor at_1 = live.detach().clone();

  rig.train_a_bit(1);  // a held snapshot keeps step 1's numbers; a second one is another set
  CHECK(at::equal(a0, at_1));
  CHECK(!at::equal(live, at_1));
  auto b = checkpoint::detail::take_snapshot(rig.state(), 2);
  checkpoint::wait_for_host_copies();
  const at::Tensor b0 = first_param(b);
  CHECK(b0.data_ptr() != a0.data_ptr());
  CHECK(at::equal(b0, live));

  const void* freed = a0.data_ptr();  // a's set, once nothing but the pool holds it, is reused
  a = {};
  a0 = at::Tensor();
  const at::Tensor blocker = at::empty_like(live);  // where malloc would put a freed copy again
  rig.train_a_bit(1);
  auto c = checkpoint::detail::take_snapshot(rig.state(), 3);
  checkpoint::wait_for_host_copies();
  const at::Tensor c0 = first_param(c);
  CHECK(c0.data_ptr() == freed);
  CHECK(at::equal(c0, live));
  CHECK(!at::equal(b0, live));  // b still holds step 2
  fs::remove_all(dir);
}
