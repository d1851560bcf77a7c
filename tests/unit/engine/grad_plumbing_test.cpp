// The gradient plumbing the GradSyncs share: clip_grad_norm (parallel/
// grad_norm.h) against hand-computed norms on a dp 2 x tp 2 world of threads,
// comm::NoSyncGroup (the no_grad_sync fault's group) against the group it
// wraps, BucketHooks' launch order on a small autograd graph, and the
// weight gradient a linear layer computes straight into its DDP slot
// (model/grad_slot.h) against at::linear's autograd. Each check has a
// control that shows it can tell right from wrong.
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>

#include <cmath>
#include <vector>

#include "engine/comm/no_sync_group.h"
#include "engine/model/grad_slot.h"
#include "engine/parallel/bucket_hooks.h"
#include "engine/parallel/grad_norm.h"

#include "tests/support/thread_world.h"
#include "tests/support/torch_doctest.h"

namespace comm = dtrain::engine::comm;
using dtrain::engine::parallel::BucketHooks;
using dtrain::engine::parallel::clip_grad_norm;
using dtrain::engine::parallel::kClipEps;

namespace {

at::Tensor vec(std::vector<float> v) { return at::tensor(v); }

std::vector<float> values(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

dtrain::mesh::Mesh shape(int dp, int tp) { return dtrain::mesh::make_mesh(dp, tp, 1); }

// Rank (d, t) of dp 2 x tp 2: R_d replicated over tp (one copy per tp
// group), S_dt split (every rank its own part).
struct Grads {
  at::Tensor replicated, split;
};
Grads grads_of(int d, int t) {
  return {d == 0 ? vec({1, 2, 2}) : vec({2, 4, 4}), vec({float(2 * d + t + 1)})};
}

}  // namespace

TEST_CASE("clip_grad_norm: a replicated gradient counted once, split ones summed over tp then dp") {
  // |R_0|^2 + |R_1|^2 + sum |S_dt|^2 = 9 + 36 + (1 + 4 + 9 + 16) = 75.
  const double want = std::sqrt(75.0);
  dtrain::testing::run_world(shape(2, 2), [&](comm::Comm& c, int) {
    comm::Group& dp = c.axis("dp");
    comm::Group& tp = c.axis("tp");
    const auto norm_of = [&](std::vector<bool> counted, std::vector<comm::Group*> over) {
      Grads g = grads_of(dp.rank(), tp.rank());
      return clip_grad_norm({g.replicated, g.split}, counted, over, /*max_norm=*/0);
    };
    const auto rel = [&](double norm) { return std::fabs(norm - want) / want; };
    const double got = norm_of({tp.rank() == 0, true}, {&tp, &dp});
    // Controls: the replica counted on both tp ranks (sqrt(120)), no group
    // summed (this rank's part only), dp left out (this dp row only); each
    // must miss by > 1e-2, 1e10 x the tolerance.
    const double twice = norm_of({}, {&tp, &dp});
    const double alone = norm_of({tp.rank() == 0, true}, {});
    const double row = norm_of({tp.rank() == 0, true}, {&tp});
    MESSAGE("rank (dp " << dp.rank() << ", tp " << tp.rank() << "): norm " << got << ", want sqrt(75) = " << want
                        << ", rel diff " << rel(got) << " (tol 1e-12); controls miss by " << rel(twice) << ", "
                        << rel(alone) << ", " << rel(row));
    CHECK(rel(got) < 1e-12);
    CHECK(std::fabs(twice - std::sqrt(120.0)) < 1e-12);
    for (double control : {twice, alone, row}) CHECK(rel(control) > 1e-2);

    // Scaling: every local gradient by max_norm / (norm + eps), the replica too.
    Grads g = grads_of(dp.rank(), tp.rank());
    const std::vector<float> before = values(at::cat({g.replicated, g.split}));
    const double max_norm = want / 2;
    CHECK(clip_grad_norm({g.replicated, g.split}, {tp.rank() == 0, true}, {&tp, &dp}, max_norm) == doctest::Approx(want));
    const double factor = max_norm / (want + kClipEps);
    const std::vector<float> after = values(at::cat({g.replicated, g.split}));
    double worst = 0;
    for (size_t i = 0; i < before.size(); ++i)
      worst = std::max(worst, std::fabs(double(after[i]) - double(float(before[i] * factor))));
    CHECK(worst < 1e-6);
    // Below max_norm, and max_norm 0 (the norm only): nothing changes.
    for (double m : {2 * want, 0.0}) {
      Grads h = grads_of(dp.rank(), tp.rank());
      clip_grad_norm({h.replicated, h.split}, {tp.rank() == 0, true}, {&tp, &dp}, m);
      CHECK(values(h.replicated) == values(grads_of(dp.rank(), tp.rank()).replicated));
    }
  });
}

TEST_CASE("NoSyncGroup: reductions leave each rank its own data; gathers, broadcasts and norms go to the real group") {
  dtrain::testing::run_world(shape(2, 1), [&](comm::Comm& c, int) {
    comm::Group& real = c.axis("dp");
    comm::NoSyncGroup none(real);
    const int r = real.rank();
    const float own = float(r + 1);
    CHECK(none.size() == 2);
    CHECK(none.rank() == r);
    CHECK(&comm::reducing_group(none) == &real);
    CHECK(&comm::reducing_group(real) == &real);

    // all_reduce: untouched on the wrapper; summed on the real group (control).
    at::Tensor t = vec({own, 10 * own});
    const uint64_t bytes = real.bytes_sent();
    none.all_reduce(t, /*async=*/true)->wait();
    CHECK(values(t) == std::vector<float>{own, 10 * own});
    CHECK(real.bytes_sent() == bytes);  // nothing went on the wire
    real.all_reduce(t);
    CHECK(values(t) == std::vector<float>{3, 30});

    // reduce_scatter: this rank's own chunk, unsummed; the real one sums (control).
    at::Tensor in = vec({own, 2 * own, 3 * own, 4 * own});  // [2 ranks x 2]
    at::Tensor out = vec({0, 0});
    none.reduce_scatter(in, out)->wait();
    CHECK(values(out) == (r == 0 ? std::vector<float>{1, 2} : std::vector<float>{6, 8}));
    real.reduce_scatter(in, out)->wait();
    CHECK(values(out) == (r == 0 ? std::vector<float>{3, 6} : std::vector<float>{9, 12}));

    // all_gather and broadcast are the real group's.
    at::Tensor gathered = vec({0, 0});
    none.all_gather(vec({own}), gathered)->wait();
    CHECK(values(gathered) == std::vector<float>{1, 2});
    at::Tensor b = vec({own});
    none.broadcast(b, /*root=*/0)->wait();
    CHECK(values(b) == std::vector<float>{1});

    // A ZeRO-style norm over the wrapper: its squares still add up over the
    // real group (1 + 4), as they do without the fault.
    const double norm = clip_grad_norm({vec({own})}, {}, {&none}, 0);
    CHECK(norm == doctest::Approx(std::sqrt(5.0)).epsilon(1e-12));
  });
}

TEST_CASE("BucketHooks: buckets launch in the given order once complete; the rest at the end of backward") {
  // Three parameters; buckets {c} = 0 and {a, b} = 1, launched 0 then 1.
  auto make = [] { return at::ones({2}).set_requires_grad(true); };
  at::Tensor a = make(), b = make(), c = make();
  std::vector<int> launched;
  BucketHooks hooks({1, 1, 0}, {0, 1}, [&](int bucket) { launched.push_back(bucket); });
  hooks.install({a, b, c});

  (a * 1 + b * 2 + c * 3).sum().backward();
  CHECK(launched == std::vector<int>{0, 1});
  CHECK(hooks.take_launched_in_backward() == 2);
  hooks.launch_rest();  // nothing left
  CHECK(launched.size() == 2);

  // c gets no gradient: bucket 0 never completes, so bucket 1 may not go
  // first; both launch from the end-of-backward callback, in order.
  launched.clear();
  hooks.reset();
  (a * 1 + b * 2).sum().backward();
  CHECK(launched == std::vector<int>{0, 1});
  CHECK(hooks.take_launched_in_backward() == 0);

  // Disabled (a no_sync micro-step): nothing until launch_rest.
  launched.clear();
  hooks.reset();
  hooks.set_enabled(false);
  (a * 1 + b * 2 + c * 3).sum().backward();
  CHECK(launched.empty());
  hooks.launch_rest();
  CHECK(launched == std::vector<int>{0, 1});
}

TEST_CASE("grad slots: the first backward's weight gradient lands in its slot, the bits of at::linear's autograd") {
  namespace model = dtrain::engine::model;
  at::manual_seed(7);
  const at::Tensor x0 = at::randn({6, 5}), w0 = at::randn({4, 5}), b0 = at::randn({4}), g = at::randn({6, 4});
  auto leaf = [](const at::Tensor& t) { return t.clone().set_requires_grad(true); };
  auto max_diff = [](const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); };

  // Reference: at::linear, two backwards (the second accumulates).
  at::Tensor x = leaf(x0), w = leaf(w0), b = leaf(b0);
  at::Tensor y = at::linear(x, w, b);
  (y * g).sum().backward();
  const at::Tensor w_grad1 = w.grad().clone(), b_grad1 = b.grad().clone(), x_grad1 = x.grad().clone();
  (at::linear(x, w, b) * g).sum().backward();

  // The slot path: the slot starts with stale numbers the write must replace.
  at::Tensor xs = leaf(x0), ws = leaf(w0), bs = leaf(b0);
  at::Tensor slot = at::full({4, 5}, 7.0f);
  model::register_grad_slot(ws, slot);
  CHECK(model::has_grad_slot(ws));
  CHECK_FALSE(model::has_grad_slot(w));
  at::Tensor ys = model::linear_2d(xs, ws, bs);
  CHECK(max_diff(ys, y) == 0.0);
  (ys * g).sum().backward();
  REQUIRE(ws.grad().defined());
  CHECK(ws.grad().data_ptr() == slot.data_ptr());  // adopted: no copy into the slot left to do
  const double dw1 = max_diff(slot, w_grad1), db1 = max_diff(bs.grad(), b_grad1), dx1 = max_diff(xs.grad(), x_grad1);
  const double control = max_diff(at::full({4, 5}, 7.0f), w_grad1);  // the slot had the write been skipped
  MESSAGE("first backward: max |diff| dW " << dw1 << ", db " << db1 << ", dx " << dx1 << "; control (slot unwritten) "
                                          << control);
  CHECK(dw1 == 0.0);
  CHECK(db1 == 0.0);
  CHECK(dx1 == 0.0);
  CHECK(control > 1.0);

  // A second backward (grad set): accumulated in place, in the slot.
  (model::linear_2d(xs, ws, bs) * g).sum().backward();
  CHECK(ws.grad().data_ptr() == slot.data_ptr());
  const double dw2 = max_diff(ws.grad(), w.grad());
  MESSAGE("second backward (accumulated): max |diff| dW " << dw2 << "; control (first backward's grad) "
                                                          << max_diff(w_grad1, w.grad()));
  CHECK(dw2 == 0.0);
  CHECK(max_diff(w_grad1, w.grad()) > 1e-3);

  // The weight used twice in one graph, grads unset and the slot armed: the
  // first backward to reach it writes the slot, the second autograd's own
  // tensor, and AccumulateGrad gets their sum (a second write into the slot
  // would have replaced the first gradient autograd still holds).
  ws.mutable_grad().reset();
  model::arm_grad_slot(ws);
  const at::Tensor g2 = at::randn({6, 4});
  (model::linear_2d(xs, ws, bs) * g + model::linear_2d(xs, ws, bs) * g2).sum().backward();
  w.mutable_grad().reset();
  (at::linear(x, w, b) * g + at::linear(x, w, b) * g2).sum().backward();
  const double dw_twice = max_diff(ws.grad(), w.grad());
  const double twice_control = max_diff(2 * g2.t().mm(x0), w.grad());
  MESSAGE("weight used twice: max |diff| dW " << dw_twice << "; control (the second use's gradient counted twice) "
                                              << twice_control);
  CHECK(dw_twice <= 1e-5);
  CHECK(twice_control > 1e-2);

  // Unregistering with another slot leaves the registration; with its own, removes it.
  model::unregister_grad_slot(ws, at::full({4, 5}, 7.0f));
  CHECK(model::has_grad_slot(ws));
  model::unregister_grad_slot(ws, slot);
  CHECK_FALSE(model::has_grad_slot(ws));
}

TEST_CASE("grad slots made on claim: made once per arming, at the backward, the bits of at::linear's autograd") {
  namespace model = dtrain::engine::model;
  at::manual_seed(11);
  const at::Tensor x0 = at::randn({6, 5}), w0 = at::randn({4, 5}), g = at::randn({6, 4});
  auto leaf = [](const at::Tensor& t) { return t.clone().set_requires_grad(true); };
  auto max_diff = [](const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); };
  at::Tensor x = leaf(x0), w = leaf(w0);
  (at::linear(x, w, {}) * g).sum().backward();

  // ZeRO-2/3's use: each claim makes a fresh buffer (stale numbers in it).
  at::Tensor xs = leaf(x0), ws = leaf(w0);
  std::vector<at::Tensor> made;
  int owner = 0, other = 0;
  model::register_grad_slot(ws, ws.device(), [&] { return made.emplace_back(at::full({4, 5}, 7.0f)); }, &owner);
  CHECK(model::has_grad_slot(ws));
  at::Tensor ys = model::linear_2d(xs, ws, {});
  CHECK(made.empty());  // nothing made by the forward
  (ys * g).sum().backward();
  REQUIRE(made.size() == 1);
  REQUIRE(ws.grad().defined());
  CHECK(ws.grad().data_ptr() == made[0].data_ptr());
  const double dw = max_diff(made[0], w.grad()), control = max_diff(at::full({4, 5}, 7.0f), w.grad());
  MESSAGE("made on claim: max |diff| dW " << dw << "; control (the made slot unwritten) " << control);
  CHECK(dw == 0.0);
  CHECK(control > 1.0);

  // Disarmed until armed again: a second backward accumulates in place and makes nothing.
  (model::linear_2d(xs, ws, {}) * g).sum().backward();
  CHECK(made.size() == 1);
  CHECK(ws.grad().data_ptr() == made[0].data_ptr());
  ws.mutable_grad().reset();
  model::arm_grad_slot(ws);
  (model::linear_2d(xs, ws, {}) * g).sum().backward();
  REQUIRE(made.size() == 2);
  CHECK(ws.grad().data_ptr() == made[1].data_ptr());
  CHECK(max_diff(made[1], made[0] / 2) == 0.0);  // made[0] holds two backwards' sum

  // Only its owner unregisters it.
  model::unregister_grad_slot_of(ws, &other);
  CHECK(model::has_grad_slot(ws));
  model::unregister_grad_slot(ws, made[1]);  // (the tensor form leaves a made slot alone)
  CHECK(model::has_grad_slot(ws));
  model::unregister_grad_slot_of(ws, &owner);
  CHECK_FALSE(model::has_grad_slot(ws));
}
