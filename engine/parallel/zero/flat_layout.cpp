// make_flat_layout and flat_range_blocks (flat_layout.h).
#include "engine/parallel/zero/flat_layout.h"

#include <algorithm>

#include "common/error.h"

namespace dtrain::engine::parallel::zero {

FlatLayout make_flat_layout(const std::vector<int64_t>& numel, const std::vector<int>& unit_of, int n,
                            int rank) {
  if (n < 1 || rank < 0 || rank >= n || numel.size() != unit_of.size())
    throw Error(ErrorCode::internal, "flat layout: bad arguments (n " + std::to_string(n) + ", rank " +
                                         std::to_string(rank) + ")");
  FlatLayout x;
  x.n = n;
  x.rank = rank;
  const int units = unit_of.empty() ? 0 : *std::max_element(unit_of.begin(), unit_of.end()) + 1;
  x.units.resize(static_cast<size_t>(units));
  for (size_t i = 0; i < numel.size(); ++i) {
    FlatUnit& u = x.units.at(static_cast<size_t>(unit_of[i]));
    u.params.push_back(static_cast<int>(i));
    u.offsets.push_back(u.numel);
    u.numel += numel[i];
  }
  for (int ui = 0; ui < units; ++ui) {
    FlatUnit& u = x.units[static_cast<size_t>(ui)];
    u.shard = std::max<int64_t>(1, (u.numel + n - 1) / n);
    u.padded = u.shard * n;
    const int64_t lo = rank * u.shard, hi = lo + u.shard;
    for (size_t k = 0; k < u.params.size(); ++k) {
      const int64_t b = std::max(lo, u.offsets[k]);
      const int64_t e = std::min(hi, u.offsets[k] + numel[static_cast<size_t>(u.params[k])]);
      if (b >= e) continue;
      x.pieces.push_back({ui, u.params[k], b - u.offsets[k], e - u.offsets[k], b - lo});
    }
  }
  return x;
}

namespace {

void blocks(const std::vector<int64_t>& shape, size_t d, int64_t begin, int64_t end,
            std::vector<Range>& prefix, std::vector<std::vector<Range>>& out) {
  if (begin >= end) return;
  if (d + 1 == shape.size()) {
    out.push_back(prefix);
    out.back().emplace_back(begin, end);
    return;
  }
  int64_t inner = 1;  // elements per index of dim d
  for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  auto row = [&](int64_t r, int64_t b, int64_t e) {  // part [b, e) of index r of dim d
    prefix.emplace_back(r, r + 1);
    blocks(shape, d + 1, b - r * inner, e - r * inner, prefix, out);
    prefix.pop_back();
  };
  int64_t r0 = begin / inner;
  if (begin % inner != 0 || end - begin < inner) {  // a partial first index
    const int64_t stop = std::min(end, (r0 + 1) * inner);
    row(r0, begin, stop);
    begin = stop;
    r0 = begin / inner;
  }
  const int64_t r1 = end / inner;
  if (begin < end && r1 > r0) {  // whole indices [r0, r1)
    out.push_back(prefix);
    out.back().emplace_back(r0, r1);
    for (size_t k = d + 1; k < shape.size(); ++k) out.back().emplace_back(0, shape[k]);
    begin = r1 * inner;
  }
  if (begin < end) row(r1, begin, end);  // a partial last index
}

}  // namespace

std::vector<std::vector<Range>> flat_range_blocks(const std::vector<int64_t>& shape, int64_t begin,
                                                  int64_t end) {
  std::vector<std::vector<Range>> out;
  if (shape.empty()) {
    if (begin < end) out.emplace_back();
    return out;
  }
  std::vector<Range> prefix;
  blocks(shape, 0, begin, end, prefix, out);
  return out;
}

}  // namespace dtrain::engine::parallel::zero
