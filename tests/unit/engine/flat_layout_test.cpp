// Unit tests of engine/parallel/zero/flat_layout: every element of every
// unit is owned by exactly one rank, shards are equal and padded, and the
// rectangular blocks of a flat range cover exactly that range, in order.
#include "engine/parallel/zero/flat_layout.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

using dtrain::engine::parallel::zero::flat_range_blocks;
using dtrain::engine::parallel::zero::make_flat_layout;
using dtrain::engine::parallel::zero::Range;

namespace {

// Flat (row-major) indices of the elements of `block` of a tensor `shape`.
void flat_indices(const std::vector<int64_t>& shape, const std::vector<Range>& block, size_t d,
                  int64_t base, std::vector<int64_t>& out) {
  if (d == shape.size()) {
    out.push_back(base);
    return;
  }
  for (int64_t i = block[d].first; i < block[d].second; ++i)
    flat_indices(shape, block, d + 1, base * shape[d] + i, out);
}

}  // namespace

TEST_CASE("flat layout: units padded to a multiple of n, every element owned once") {
  const std::vector<int64_t> numel = {5, 7, 3, 1, 10};
  const std::vector<int> unit_of = {0, 0, 1, 1, 2};
  for (int n : {1, 2, 3, 4, 7}) {
    std::vector<std::vector<int>> owner(numel.size());
    for (size_t i = 0; i < numel.size(); ++i) owner[i].assign(size_t(numel[i]), 0);
    for (int r = 0; r < n; ++r) {
      auto x = make_flat_layout(numel, unit_of, n, r);
      REQUIRE(x.units.size() == 3);
      CHECK(x.units[0].numel == 12);
      CHECK(x.units[1].offsets == std::vector<int64_t>{0, 3});
      for (auto& u : x.units) {
        CHECK(u.padded % n == 0);
        CHECK(u.padded >= u.numel);
        CHECK(u.padded - u.numel < n);
        CHECK(u.shard * n == u.padded);
      }
      for (auto& pc : x.pieces) {
        const auto& u = x.units[size_t(pc.unit)];
        CHECK(pc.shard_offset >= 0);
        CHECK(pc.shard_offset + (pc.end - pc.begin) <= u.shard);
        for (int64_t e = pc.begin; e < pc.end; ++e) ++owner[size_t(pc.param)][size_t(e)];
      }
    }
    for (auto& o : owner)
      for (int c : o) CHECK(c == 1);
  }
}

TEST_CASE("flat layout: a rank's piece sits where its parameter sits in the unit") {
  // unit 0 = {a: 6, b: 4}, padded to 12 over n = 3 (shard 4): rank 1 owns
  // flat [4, 8) = a[4:6] at shard offset 0 and b[0:2] at shard offset 2.
  auto x = make_flat_layout({6, 4}, {0, 0}, 3, 1);
  REQUIRE(x.pieces.size() == 2);
  CHECK(x.pieces[0].param == 0);
  CHECK(x.pieces[0].begin == 4);
  CHECK(x.pieces[0].end == 6);
  CHECK(x.pieces[0].shard_offset == 0);
  CHECK(x.pieces[1].param == 1);
  CHECK(x.pieces[1].begin == 0);
  CHECK(x.pieces[1].end == 2);
  CHECK(x.pieces[1].shard_offset == 2);
  // rank 2 owns flat [8, 12) = b[2:4] and two padding elements.
  auto y = make_flat_layout({6, 4}, {0, 0}, 3, 2);
  REQUIRE(y.pieces.size() == 1);
  CHECK(y.pieces[0].begin == 2);
  CHECK(y.pieces[0].end == 4);
}

TEST_CASE("flat range blocks cover exactly the range, in flat order") {
  const std::vector<std::vector<int64_t>> shapes = {{13}, {4, 5}, {3, 1, 4}, {2, 3, 4, 5}, {1, 7}};
  int cases = 0;
  for (const auto& shape : shapes) {
    int64_t total = 1;
    for (int64_t d : shape) total *= d;
    for (int64_t b = 0; b <= total; ++b)
      for (int64_t e = b; e <= total; ++e) {
        auto blocks = flat_range_blocks(shape, b, e);
        std::vector<int64_t> got;
        for (auto& block : blocks) {
          REQUIRE(block.size() == shape.size());
          flat_indices(shape, block, 0, 0, got);
        }
        std::vector<int64_t> want;
        for (int64_t i = b; i < e; ++i) want.push_back(i);
        REQUIRE_MESSAGE(got == want, "shape rank " << shape.size() << " range [" << b << ", " << e << ")");
        CHECK(blocks.size() <= 2 * shape.size() + 1);
        ++cases;
      }
  }
  MESSAGE(cases << " ranges checked");
  CHECK(flat_range_blocks({}, 0, 1).size() == 1);  // a 0-dim tensor: one block, no ranges
  CHECK(flat_range_blocks({}, 0, 0).empty());
}
