// Unit tests of engine/random: Philox4x32-10 against Random123's published
// known-answer vectors, and the layout-invariant dropout mask: a shard's mask
// is the matching slice of the full tensor's mask (with a shifted slice as the
// negative control), streams differ per step/layer/site/seed, the keep
// fraction is 1-p within 5 sigma, the p = 0 / p = 1 edges, and backward.
#include "engine/random/philox.h"

#include <ATen/ops/equal.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "common/error.h"

#include "tests/support/torch_doctest.h"

namespace {

using dtrain::engine::random::dropout_keep_mask;
using dtrain::engine::random::DropoutKey;
using dtrain::engine::random::DropoutSite;
using dtrain::engine::random::layout_invariant_dropout;
using dtrain::engine::random::philox4x32_10;
using Slice = std::vector<std::pair<int64_t, int64_t>>;

const c10::Device kCpu(c10::kCPU);
const DropoutKey kKey{1234, 7, 3, DropoutSite::attn_resid};

Slice full_slice(const std::vector<int64_t>& shape) {
  Slice s;
  for (int64_t n : shape) s.emplace_back(0, n);
  return s;
}

// The matching part of a full tensor: t[b0:e0, b1:e1, ...].
at::Tensor take(const at::Tensor& t, const Slice& slice) {
  at::Tensor out = t;
  for (size_t d = 0; d < slice.size(); ++d) {
    out = out.slice(static_cast<int64_t>(d), slice[d].first, slice[d].second);
  }
  return out;
}

int64_t count_differing(const at::Tensor& a, const at::Tensor& b) {
  return at::ne(a, b).sum().item<int64_t>();
}

// A shard's mask equals the full mask's slice; the same shard read one step
// off along `shift_dim` (the negative control) differs in many elements.
void check_shard(const std::vector<int64_t>& shape, const Slice& slice, size_t shift_dim, const char* what) {
  const at::Tensor full = dropout_keep_mask(kKey, shape, full_slice(shape), 0.5, kCpu);
  const at::Tensor shard = dropout_keep_mask(kKey, shape, slice, 0.5, kCpu);
  Slice shifted = slice;
  const int64_t delta = slice[shift_dim].first > 0 ? -1 : 1;
  shifted[shift_dim] = {slice[shift_dim].first + delta, slice[shift_dim].second + delta};
  const int64_t same = count_differing(shard, take(full, slice));
  const int64_t control = count_differing(shard, take(full, shifted));
  std::printf("philox shard %-22s %6lld elements: %lld differ from the full mask's slice (need 0); "
              "shifted slice: %lld differ (need > 25%%)\n",
              what, static_cast<long long>(shard.numel()), static_cast<long long>(same),
              static_cast<long long>(control));
  CHECK(shard.sizes() == take(full, slice).sizes());
  CHECK(same == 0);
  CHECK(control > shard.numel() / 4);
}

}  // namespace

TEST_CASE("philox4x32_10 matches Random123's known-answer vectors") {
  // Random123 tests/kat_vectors, lines "philox4x32 10 <counter x4> <key x2> <output x4>".
  struct Kat {
    std::array<uint32_t, 4> counter;
    std::array<uint32_t, 2> key;
    std::array<uint32_t, 4> expect;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& kat : kats) {
    const auto got = philox4x32_10(kat.counter, kat.key);
    std::printf("philox KAT counter %08x.. key %08x %08x -> %08x %08x %08x %08x "
                "(expect %08x %08x %08x %08x)\n",
                kat.counter[0], kat.key[0], kat.key[1], got[0], got[1], got[2], got[3], kat.expect[0],
                kat.expect[1], kat.expect[2], kat.expect[3]);
    CHECK(got == kat.expect);
  }
}

TEST_CASE("philox dropout mask: each element's bit is the documented philox lane of its global index") {
  // Pins the definition (any function of the global index alone would pass
  // the sharding test): counter = (idx/4 lo, idx/4 hi, step, layer << 8 | site).
  const DropoutKey key{0x0123456789abcdefULL, 42, 5, DropoutSite::mlp_resid};
  const double p = 0.3;
  const std::vector<int64_t> shape = {3, 5, 7};
  const at::Tensor mask = dropout_keep_mask(key, shape, full_slice(shape), p, kCpu).flatten();
  const auto threshold = static_cast<uint64_t>(std::llround(0.7 * 4294967296.0));
  int64_t mismatches = 0;
  for (uint32_t idx = 0; idx < 3 * 5 * 7; ++idx) {
    const auto lanes = philox4x32_10({idx / 4, 0, 42, (5u << 8) | 3u}, {0x89abcdefu, 0x01234567u});
    const float expect = lanes[idx % 4] < threshold ? static_cast<float>(1.0 / 0.7) : 0.0f;
    mismatches += mask[idx].item<float>() != expect;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("philox dropout mask of a shard is the matching slice of the full mask") {
  // dim 0: the rows of dp rank 1, micro-batch 1 with micro_batch 2, grad_accum 2, dp 2:
  // global row = dp_rank * micro_batch * grad_accum + micro * micro_batch + i = 6, 7.
  check_shard({8, 6, 10}, {{6, 8}, {0, 6}, {0, 10}}, 0, "dim 0 (dp rows)");
  check_shard({8, 6, 10}, {{0, 8}, {2, 5}, {0, 10}}, 1, "middle dim (seq par)");
  check_shard({8, 6, 10}, {{0, 8}, {0, 6}, {5, 10}}, 2, "last dim (tp cols)");
  check_shard({12, 9}, {{4, 8}, {2, 7}}, 1, "2-D block");
  // Attention probabilities [B, heads, T, T]: tp rank 1 of 2 holds heads 2..4.
  check_shard({4, 4, 8, 8}, {{1, 3}, {2, 4}, {0, 8}, {0, 8}}, 1, "heads 2..4 of [B,H,T,T]");

  // The shards of a dp x tp partition, stitched back, are the full mask.
  const std::vector<int64_t> shape = {8, 6, 10};
  const at::Tensor full = dropout_keep_mask(kKey, shape, full_slice(shape), 0.5, kCpu);
  at::Tensor stitched = at::zeros(shape);
  for (int64_t r = 0; r < 8; r += 2) {
    for (int64_t c = 0; c < 10; c += 5) {
      const Slice s = {{r, r + 2}, {0, 6}, {c, c + 5}};
      take(stitched, s).copy_(dropout_keep_mask(kKey, shape, s, 0.5, kCpu));
    }
  }
  CHECK(at::equal(stitched, full));
}

TEST_CASE("philox dropout masks differ across step, layer, site and seed") {
  const std::vector<int64_t> shape = {64, 64};
  const at::Tensor base = dropout_keep_mask(kKey, shape, full_slice(shape), 0.5, kCpu);
  const int64_t n = base.numel();
  auto differ = [&](DropoutKey k, const char* what) {
    const int64_t d = count_differing(base, dropout_keep_mask(k, shape, full_slice(shape), 0.5, kCpu));
    std::printf("philox stream %-16s differs in %.3f of elements (expect ~0.5, need > 0.4)\n", what,
                static_cast<double>(d) / static_cast<double>(n));
    CHECK(d > n * 4 / 10);
  };
  DropoutKey k = kKey;
  k.step += 1;
  differ(k, "step + 1");
  k = kKey;
  k.layer += 1;
  differ(k, "layer + 1");
  k = kKey;
  k.site = DropoutSite::mlp_resid;
  differ(k, "site");
  k = kKey;
  k.seed += 1;
  differ(k, "seed + 1");
  k = kKey;
  k.seed += uint64_t{1} << 32;
  differ(k, "seed high word");
  // Same key, same mask: no hidden state between calls.
  CHECK(at::equal(base, dropout_keep_mask(kKey, shape, full_slice(shape), 0.5, kCpu)));
}

TEST_CASE("philox dropout keep fraction is 1-p within 5 sigma") {
  const std::vector<int64_t> shape = {100, 1000};
  for (double p : {0.1, 0.5, 0.9}) {
    const at::Tensor mask = dropout_keep_mask(kKey, shape, full_slice(shape), p, kCpu);
    const double n = static_cast<double>(mask.numel());
    const auto kept = static_cast<double>(mask.ne(0).sum().item<int64_t>());
    const double sigma = std::sqrt(n * p * (1.0 - p));
    const double scale = static_cast<float>(1.0 / (1.0 - p));
    const auto wrong_values = mask.ne(0).logical_and(mask.ne(scale)).sum().item<int64_t>();
    std::printf("philox keep fraction p=%.1f: %.5f (expect %.5f, %.2f sigma, need < 5); mean %.4f; "
                "values not 0 or 1/(1-p): %lld\n",
                p, kept / n, 1.0 - p, std::abs(kept - n * (1.0 - p)) / sigma, mask.mean().item<double>(),
                static_cast<long long>(wrong_values));
    CHECK(std::abs(kept - n * (1.0 - p)) < 5.0 * sigma);
    CHECK(wrong_values == 0);
  }
}

TEST_CASE("philox dropout edges: p = 0, p = 1, eval mode, scalar, empty slice") {
  const std::vector<int64_t> shape = {16, 32};
  const at::Tensor x = at::randn(shape);
  CHECK(at::equal(dropout_keep_mask(kKey, shape, full_slice(shape), 0.0, kCpu), at::ones(shape)));
  const at::Tensor none = dropout_keep_mask(kKey, shape, full_slice(shape), 1.0, kCpu);
  CHECK(at::equal(none, at::zeros(shape)));  // zeros, not NaN from 0 * inf
  CHECK(at::equal(layout_invariant_dropout(x, 1.0, true, kKey, shape, full_slice(shape)), at::zeros(shape)));
  CHECK(layout_invariant_dropout(x, 0.0, true, kKey, shape, full_slice(shape)).is_same(x));
  CHECK(layout_invariant_dropout(x, 0.5, false, kKey, shape, full_slice(shape)).is_same(x));
  CHECK(dropout_keep_mask(kKey, {}, {}, 0.5, kCpu).dim() == 0);
  CHECK(dropout_keep_mask(kKey, shape, {{3, 3}, {0, 32}}, 0.5, kCpu).numel() == 0);
  const at::Tensor half = at::randn(shape).to(at::kBFloat16);
  const at::Tensor half_out = layout_invariant_dropout(half, 0.5, true, kKey, shape, full_slice(shape));
  CHECK((half_out.scalar_type() == at::kBFloat16));
}

TEST_CASE("philox dropout rejects a slice that does not match the input or the global shape") {
  const at::Tensor x = at::randn({4, 6});
  try {
    layout_invariant_dropout(x, 0.5, true, kKey, {8, 6}, {{0, 3}, {0, 6}});
    CHECK_MESSAGE(false, "a [4, 6] input with a 3-row slice was accepted");
  } catch (const dtrain::Error& e) {
    std::printf("philox rejects: %s\n", e.what());
    CHECK(std::string(e.what()).find("[4, 6]") != std::string::npos);
    CHECK(std::string(e.what()).find("[0:3, 0:6]") != std::string::npos);
  }
  CHECK_THROWS_AS(dropout_keep_mask(kKey, {8, 6}, {{6, 10}, {0, 6}}, 0.5, kCpu), dtrain::Error);
  CHECK_THROWS_AS(dropout_keep_mask(kKey, {8, 6}, {{0, 8}}, 0.5, kCpu), dtrain::Error);
  CHECK_THROWS_AS(dropout_keep_mask(kKey, {8, 6}, {{0, 8}, {0, 6}}, 1.5, kCpu), dtrain::Error);
  DropoutKey bad = kKey;
  bad.layer = 1 << 24;
  CHECK_THROWS_AS(dropout_keep_mask(bad, {8, 6}, {{0, 8}, {0, 6}}, 0.5, kCpu), dtrain::Error);
}

TEST_CASE("philox dropout backward multiplies by the same mask") {
  const std::vector<int64_t> shape = {8, 4, 16};
  const Slice slice = {{2, 6}, {0, 4}, {0, 16}};
  const at::Tensor x = at::randn({4, 4, 16}).set_requires_grad(true);
  const at::Tensor y = layout_invariant_dropout(x, 0.25, true, kKey, shape, slice);
  y.sum().backward();
  const at::Tensor mask = dropout_keep_mask(kKey, shape, slice, 0.25, kCpu);
  const double max_diff = x.grad().sub(mask).abs().max().item<double>();
  DropoutKey next = kKey;
  next.step += 1;
  const at::Tensor other = dropout_keep_mask(next, shape, slice, 0.25, kCpu);
  const double control = x.grad().sub(other).abs().max().item<double>();
  std::printf("philox dropout backward: max |grad - mask| %.3g (need 0); vs the next step's mask %.3g "
              "(need 1/(1-p) = 1.33)\n",
              max_diff, control);
  CHECK(max_diff == 0.0);
  CHECK(control > 1.3);
  CHECK(at::equal(y.detach(), x.detach().mul(mask)));
}
