// Ring attention (engine/parallel/context/): cp 1, 2 and 4 as threads of this
// process (Gloo over a HashStore) against tiled_attention on the full
// sequence: output and dq, dk, dv, dropout 0 and 0.1, several tiles per
// chunk with a short last one; the bytes each rank sends against the
// header's formula; grouped-query K/V (fewer kv heads) un-repeated;
// local_only as the control that must miss; the chunk layout and cp_local /
// cp_full. Legend: BH = batch rows x heads, T = time,
// Tl = T / cp, D = head dim.
#include "engine/parallel/context/cp_layout.h"
#include "engine/parallel/context/ring_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "tests/support/thread_world.h"
#include "tests/support/torch_doctest.h"

using namespace dtrain::engine;
namespace ctx = dtrain::engine::parallel::context;

namespace {

constexpr double kTol = 1e-6;  // relative to each tensor's largest element
constexpr int64_t kB = 2, kH = 2, kD = 8;
constexpr int64_t kChunk = 10, kTile = 4;  // 3 tiles per chunk, the last of 2 rows

struct Result {
  at::Tensor out, dq, dk, dv;
};

struct Inputs {
  at::Tensor q, k, v, dout;  // q, dout [BH, T, D]; k, v [B*kv, T, D]
};

// kv: key/value heads (grouped-query attention when below kH).
Inputs inputs(int64_t T, uint64_t seed, at::ScalarType dtype = at::kFloat, int64_t kv = kH) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto r = [&](int64_t heads) { return at::randn({kB * heads, T, kD}, gen).to(dtype); };
  Inputs in;
  in.q = r(kH);
  in.k = r(kv);
  in.v = r(kv);
  in.dout = r(kH);
  return in;
}

model::AttentionDropout dropout_of(double p) {
  model::AttentionDropout d;
  d.p = p;
  d.key = {1234, 7, 1, random::DropoutSite::attn_probs};
  d.global_rows = kB + 3;  // this micro-batch is rows [2, 2 + B) of a larger step batch
  d.row_begin = 2;
  d.heads_global = kH;
  return d;
}

// The reference: tiled attention over the full sequence, its default tile.
Result full_tiled(const Inputs& in, const model::AttentionDropout& drop) {
  at::Tensor q = in.q.clone().requires_grad_(true), k = in.k.clone().requires_grad_(true),
             v = in.v.clone().requires_grad_(true);
  at::Tensor out = model::tiled_attention(q, k, v, kB, drop);
  auto g = torch::autograd::grad({out}, {q, k, v}, {in.dout});
  return {out.detach(), g[0], g[1], g[2]};
}

// This rank's ring attention on its cp_local parts; bytes = what it sent
// in forward and in backward.
Result ring_local(comm::Group& cp, const Inputs& in, const model::AttentionDropout& drop, const ctx::RingOptions& opt,
                  ctx::RingBytes* bytes) {
  const int n = cp.size(), r = cp.rank();
  auto local = [&](const at::Tensor& t) { return ctx::cp_local(t, 1, n, r); };
  at::Tensor q = local(in.q).requires_grad_(true), k = local(in.k).requires_grad_(true),
             v = local(in.v).requires_grad_(true);
  cp.reset_bytes_sent();
  at::Tensor out = ctx::ring_attention(q, k, v, kB, drop, cp, opt);
  bytes->forward = cp.bytes_sent();
  cp.reset_bytes_sent();
  auto g = torch::autograd::grad({out}, {q, k, v}, {local(in.dout)});
  bytes->backward = cp.bytes_sent();
  return {out.detach(), g[0], g[1], g[2]};
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item().toDouble();
}

// Worst |ring - reference| / max |reference| over out, dq, dk, dv on this
// rank's rows (each tensor against its own scale: the gradients reach ~5,
// where 1e-6 absolute is two fp32 ulps and any other summation order
// misses it), and the worst absolute difference.
struct Diff {
  double rel = 0, abs = 0;
};
Diff worst(const Result& ring, const Result& ref, int n, int r) {
  Diff d;
  const std::vector<std::pair<at::Tensor, at::Tensor>> pairs = {
      {ring.out, ref.out}, {ring.dq, ref.dq}, {ring.dk, ref.dk}, {ring.dv, ref.dv}};
  for (const auto& [got, full] : pairs) {
    const double diff = max_diff(got, ctx::cp_local(full, 1, n, r));
    d.abs = std::max(d.abs, diff);
    d.rel = std::max(d.rel, diff / full.abs().max().item().toDouble());
  }
  return d;
}

// The header's formula, written out again (kv: key/value heads).
ctx::RingBytes expected_bytes(int n, int64_t Tl, int64_t elem, int64_t kv = kH) {
  if (n == 1) return {};
  const uint64_t block = uint64_t(2 * kB * kv * Tl * kD);
  return {(n - 1) * block * elem, (n - 1) * block * elem + n * block * 4};
}

struct Worst {
  std::mutex mu;
  Diff diff;
  void add(const Diff& d) {
    std::lock_guard<std::mutex> lock(mu);
    diff.rel = std::max(diff.rel, d.rel);
    diff.abs = std::max(diff.abs, d.abs);
  }
};

void no_shm(comm::WorldInfo&, comm::CommOptions& o) { o.shm = false; }

// n ranks on the cp axis: the cp group is the one under test.
dtrain::mesh::Mesh world_of(int n) { return dtrain::mesh::make_mesh(1, 1, 1, 1, n); }

}  // namespace

TEST_CASE("ring attention: cp 1, 2, 4 match tiled attention on the full sequence (dropout 0 and 0.1)") {
  for (int n : {1, 2, 4}) {
    const int64_t T = 2 * n * kChunk, Tl = T / n;
    for (double p : {0.0, 0.1}) {
      const Inputs in = inputs(T, 11 + n);
      const model::AttentionDropout drop = dropout_of(p);
      const Result ref = full_tiled(in, drop);
      Worst diff;
      std::mutex mu;
      std::vector<std::string> byte_errors;
      dtrain::testing::run_world(world_of(n), [&](comm::Comm& c, int r) {
        ctx::RingBytes bytes;
        ctx::RingOptions opt;
        opt.tile = kTile;
        diff.add(worst(ring_local(c.group(dtrain::mesh::GroupKind::cp), in, drop, opt, &bytes), ref, n, r));
        const ctx::RingBytes want = expected_bytes(n, Tl, 4);
        const ctx::RingBytes fn = ctx::ring_attention_bytes(n, kB * kH, Tl, kD, 4);
        if (bytes.forward != want.forward || bytes.backward != want.backward || fn.forward != want.forward ||
            fn.backward != want.backward) {
          std::lock_guard<std::mutex> lock(mu);
          byte_errors.push_back("rank " + std::to_string(r) + " sent " + std::to_string(bytes.forward) + " + " +
                                std::to_string(bytes.backward) + " bytes, formula " + std::to_string(want.forward) +
                                " + " + std::to_string(want.backward) + ", ring_attention_bytes " +
                                std::to_string(fn.forward) + " + " + std::to_string(fn.backward));
        }
      }, no_shm);
      const ctx::RingBytes want = expected_bytes(n, Tl, 4);
      MESSAGE("cp " << n << " T " << T << " tile " << kTile << " dropout " << p
                    << ": max |ring - tiled| / max |tiled| over out, dq, dk, dv " << diff.diff.rel
                    << " (tol " << kTol << "; absolute " << diff.diff.abs << "); bytes per rank forward "
                    << want.forward << ", backward " << want.backward);
      CHECK(diff.diff.rel <= kTol);
      for (const std::string& e : byte_errors) FAIL_CHECK(e);
    }
  }
}

TEST_CASE("ring attention: grouped-query K/V (2 query heads per kv head) at cp 2 and 4 match tiled, un-repeated") {
  for (int n : {2, 4}) {
    const int64_t T = 2 * n * kChunk, Tl = T / n;
    const Inputs in = inputs(T, 41 + n, at::kFloat, /*kv=*/1);
    const model::AttentionDropout drop = dropout_of(0.1);
    const Result ref = full_tiled(in, drop);
    Worst diff;
    std::mutex mu;
    std::vector<std::string> errors;
    dtrain::testing::run_world(world_of(n), [&](comm::Comm& c, int r) {
      ctx::RingBytes bytes;
      ctx::RingOptions opt;
      opt.tile = kTile;
      const Result got = ring_local(c.group(dtrain::mesh::GroupKind::cp), in, drop, opt, &bytes);
      diff.add(worst(got, ref, n, r));
      const ctx::RingBytes want = expected_bytes(n, Tl, 4, 1);  // K/V of one kv head: half of MHA's
      std::lock_guard<std::mutex> lock(mu);
      if (got.dk.size(0) != kB || bytes.forward != want.forward || bytes.backward != want.backward)
        errors.push_back("rank " + std::to_string(r) + ": dk rows " + std::to_string(got.dk.size(0)) + ", sent " +
                         std::to_string(bytes.forward) + " + " + std::to_string(bytes.backward) + " bytes, formula " +
                         std::to_string(want.forward) + " + " + std::to_string(want.backward));
    }, no_shm);
    MESSAGE("cp " << n << " GQA (" << kH << " heads, 1 kv head) dropout 0.1: max |ring - tiled| / max |tiled| over "
                  << "out, dq, dk, dv " << diff.diff.rel << " (tol " << kTol << "); K/V bytes per rank forward "
                  << expected_bytes(n, Tl, 4, 1).forward);
    CHECK(diff.diff.rel <= kTol);
    for (const std::string& e : errors) FAIL_CHECK(e);
  }
}

TEST_CASE("ring attention: bf16 K/V travel as bf16 (bytes)") {
  const int n = 2;
  const int64_t T = 2 * n * kChunk, Tl = T / n;
  const Inputs in = inputs(T, 5, at::kBFloat16);
  std::mutex mu;
  std::vector<std::string> errors;
  dtrain::testing::run_world(world_of(n), [&](comm::Comm& c, int r) {
    ctx::RingBytes bytes;
    ctx::RingOptions opt;
    opt.tile = kTile;
    const Result got = ring_local(c.group(dtrain::mesh::GroupKind::cp), in, dropout_of(0.0), opt, &bytes);
    const ctx::RingBytes want = expected_bytes(n, Tl, 2);
    std::lock_guard<std::mutex> lock(mu);
    if (got.out.scalar_type() != at::kBFloat16 || got.dk.scalar_type() != at::kBFloat16)
      errors.push_back("rank " + std::to_string(r) + ": output or dk not bf16");
    if (bytes.forward != want.forward || bytes.backward != want.backward)
      errors.push_back("rank " + std::to_string(r) + " sent " + std::to_string(bytes.forward) + " + " +
                       std::to_string(bytes.backward) + " bytes, formula " + std::to_string(want.forward) + " + " +
                       std::to_string(want.backward));
  }, no_shm);
  MESSAGE("cp 2 bf16: bytes per rank forward " << expected_bytes(n, Tl, 2).forward << ", backward "
                                               << expected_bytes(n, Tl, 2).backward);
  for (const std::string& e : errors) FAIL_CHECK(e);
}

TEST_CASE("ring attention: local_only (no ring) misses the full-sequence result by far") {
  for (int n : {2, 4}) {
    const int64_t T = 2 * n * kChunk;
    const Inputs in = inputs(T, 21 + n);
    const model::AttentionDropout drop = dropout_of(0.0);
    const Result ref = full_tiled(in, drop);
    Worst diff;
    dtrain::testing::run_world(world_of(n), [&](comm::Comm& c, int r) {
      ctx::RingBytes bytes;
      ctx::RingOptions opt;
      opt.tile = kTile;
      opt.local_only = true;
      diff.add(worst(ring_local(c.group(dtrain::mesh::GroupKind::cp), in, drop, opt, &bytes), ref, n, r));
      if (bytes.forward != 0 || bytes.backward != 0) throw std::runtime_error("local_only sent bytes");
    }, no_shm);
    MESSAGE("cp " << n << " local_only: max |ring - tiled| / max |tiled| " << diff.diff.rel << " (must be >= "
                  << 100 * kTol << ")");
    CHECK(diff.diff.rel >= 100 * kTol);
  }
}

TEST_CASE("ring attention: one tile per chunk (the default tile, longer than the chunk); bad shapes throw") {
  const int n = 2;
  const int64_t T = 2 * n * kChunk;
  const Inputs in = inputs(T, 31);
  const model::AttentionDropout drop = dropout_of(0.1);
  const Result ref = full_tiled(in, drop);
  Worst diff;
  dtrain::testing::run_world(world_of(n), [&](comm::Comm& c, int r) {
    ctx::RingBytes bytes;
    diff.add(worst(ring_local(c.group(dtrain::mesh::GroupKind::cp), in, drop, ctx::RingOptions{}, &bytes), ref, n, r));
    const at::Tensor odd = at::zeros({kB * kH, 2 * kChunk - 1, kD});  // Tl odd: not two chunks
    CHECK_THROWS_AS(ctx::ring_attention(odd, odd, odd, kB, drop, c.group(dtrain::mesh::GroupKind::cp)), dtrain::Error);
  }, no_shm);
  MESSAGE("cp 2 tile " << model::kAttentionTile << " dropout 0.1: max |ring - tiled| / max |tiled| " << diff.diff.rel
                       << " (tol " << kTol << ")");
  CHECK(diff.diff.rel <= kTol);
}

TEST_CASE("cp layout: chunk ranges, global positions, cp_local / cp_full round trip") {
  // T 12, cp 3: chunks of 2; rank r holds chunks r and 5-r.
  const std::vector<std::vector<int64_t>> want = {{0, 1, 10, 11}, {2, 3, 8, 9}, {4, 5, 6, 7}};
  const at::Tensor full = at::arange(12, at::kLong).view({1, 12}).expand({3, 12}).contiguous();  // [3, T]
  std::vector<at::Tensor> locals;
  for (int r = 0; r < 3; ++r) {
    const auto ch = ctx::cp_chunks(12, 3, r);
    CHECK(ch[0].begin == want[r][0]);
    CHECK(ch[0].end == want[r][1] + 1);
    CHECK(ch[1].begin == want[r][2]);
    CHECK(ch[1].end == want[r][3] + 1);
    const at::Tensor local = ctx::cp_local(full, 1, 3, r);  // [3, 4]
    for (int64_t i = 0; i < 4; ++i) {
      CHECK(ctx::cp_global_position(i, 12, 3, r) == want[r][i]);
      CHECK(local[2][i].item<int64_t>() == want[r][i]);
    }
    locals.push_back(local);
  }
  CHECK(at::equal(ctx::cp_full(locals, 1), full));
  CHECK(at::equal(ctx::cp_full(at::cat(locals, 1), 1, 3), full));
  CHECK(at::equal(ctx::cp_full({ctx::cp_local(full, 1, 1, 0)}, 1), full));
  // dim 0, cp 2: a [T, 3] tensor.
  const at::Tensor rows = at::arange(24, at::kFloat).view({8, 3});
  CHECK(at::equal(ctx::cp_full({ctx::cp_local(rows, 0, 2, 0), ctx::cp_local(rows, 0, 2, 1)}, 0), rows));
  CHECK_THROWS_AS(ctx::cp_chunks(10, 3, 0), dtrain::Error);  // 6 does not divide 10
  CHECK_THROWS_AS(ctx::cp_chunks(12, 3, 3), dtrain::Error);
  CHECK_THROWS_AS(ctx::cp_global_position(4, 12, 3, 0), dtrain::Error);
}
