// Philox4x32-10 and the layout-invariant dropout mask of philox.h. The mask is
// filled by a plain CPU loop over the slice (one philox block per 4 global
// elements, reused while consecutive elements share it) and then moved: the
// models here are small, and a CPU loop is the same bits on every device.
// Does not pick keys or slices for the model: its call sites do.
#include "engine/random/philox.h"

#include "common/error.h"

#include <ATen/ops/empty.h>

#include <cmath>
#include <limits>
#include <string>

namespace dtrain::engine::random {

namespace {

// Random123's philox4x32 constants: the round multipliers and the Weyl
// sequence that bumps the key between rounds (golden ratio, sqrt(3) - 1).
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

constexpr int64_t kMaxStep = int64_t{1} << 32;   // step fills counter word 2
constexpr int kMaxLayer = 1 << 24;               // layer << 8 | site fills word 3

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

std::string slice_str(const std::vector<std::pair<int64_t, int64_t>>& slice) {
  std::string s = "[";
  for (size_t d = 0; d < slice.size(); ++d) {
    s += (d ? ", " : "") + std::to_string(slice[d].first) + ":" + std::to_string(slice[d].second);
  }
  return s + "]";
}

// All inputs come from our own model code, so a bad one is our bug: internal.
void check_mask_args(const DropoutKey& key, const std::vector<int64_t>& global_shape,
                     const std::vector<std::pair<int64_t, int64_t>>& slice, double p) {
  if (!(p >= 0.0 && p <= 1.0)) {
    throw Error(ErrorCode::internal, "dropout: p = " + std::to_string(p) + " is outside [0, 1]");
  }
  if (key.step < 0 || key.step >= kMaxStep || key.layer < 0 || key.layer >= kMaxLayer) {
    throw Error(ErrorCode::internal, "dropout: key step " + std::to_string(key.step) + ", layer " +
                                         std::to_string(key.layer) +
                                         " is outside step [0, 2^32), layer [0, 2^24)");
  }
  bool ok = slice.size() == global_shape.size();
  for (size_t d = 0; ok && d < slice.size(); ++d) {
    ok = 0 <= slice[d].first && slice[d].first <= slice[d].second && slice[d].second <= global_shape[d];
  }
  if (!ok) {
    throw Error(ErrorCode::internal, "dropout: slice " + slice_str(slice) +
                                         " does not fit in global shape " + shape_str(global_shape),
                "give one {begin, end} per dim with 0 <= begin <= end <= that dim's global size");
  }
}

// Writes the slice's multipliers in row-major order of the slice: an
// odometer over every dim but the last, then a run along the last, whose
// global flat indices are consecutive.
void fill_mask(float* out, const DropoutKey& key, const std::vector<int64_t>& global_shape,
               const std::vector<std::pair<int64_t, int64_t>>& slice, uint64_t threshold, float scale) {
  const std::array<uint32_t, 2> k = {static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32)};
  const uint32_t word2 = static_cast<uint32_t>(key.step);
  const uint32_t word3 = (static_cast<uint32_t>(key.layer) << 8) | static_cast<uint32_t>(key.site);
  uint64_t cached_block = std::numeric_limits<uint64_t>::max();  // idx / 4 <= 2^61: never a real block
  std::array<uint32_t, 4> lanes{};
  auto multiplier = [&](uint64_t idx) {
    const uint64_t block = idx >> 2;
    if (block != cached_block) {
      lanes = philox4x32_10(
          {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), word2, word3}, k);
      cached_block = block;
    }
    return lanes[idx & 3] < threshold ? scale : 0.0f;
  };

  const size_t n = global_shape.size();
  if (n == 0) {  // a scalar: one element, index 0
    *out = multiplier(0);
    return;
  }
  for (const auto& [begin, end] : slice) {
    if (begin == end) return;  // empty slice: nothing to write
  }
  std::vector<int64_t> stride(n, 1);  // the global tensor's row-major strides
  for (size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * global_shape[d];
  std::vector<int64_t> pos(n - 1, 0);  // odometer over dims 0..n-2, relative to the slice
  const int64_t inner_begin = slice[n - 1].first;
  const int64_t inner_len = slice[n - 1].second - slice[n - 1].first;
  for (;;) {
    int64_t base = inner_begin;
    for (size_t d = 0; d + 1 < n; ++d) base += (slice[d].first + pos[d]) * stride[d];
    for (int64_t j = 0; j < inner_len; ++j) *out++ = multiplier(static_cast<uint64_t>(base + j));
    size_t d = n - 1;
    while (d > 0 && ++pos[d - 1] == slice[d - 1].second - slice[d - 1].first) pos[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      key[0] += kPhiloxW0;
      key[1] += kPhiloxW1;
    }
    const uint64_t p0 = uint64_t{kPhiloxM0} * counter[0];
    const uint64_t p1 = uint64_t{kPhiloxM1} * counter[2];
    counter = {static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(p0)};
  }
  return counter;
}

at::Tensor dropout_keep_mask(const DropoutKey& key, const std::vector<int64_t>& global_shape,
                             const std::vector<std::pair<int64_t, int64_t>>& slice, double p,
                             c10::Device device) {
  check_mask_args(key, global_shape, slice, p);
  std::vector<int64_t> local(slice.size());
  for (size_t d = 0; d < slice.size(); ++d) local[d] = slice[d].second - slice[d].first;
  // keep iff u32 < round((1-p) * 2^32): p = 0 gives 2^32 (every draw kept),
  // p = 1 gives 0 (none kept, and the scale is never 1/0).
  const auto threshold = static_cast<uint64_t>(std::llround((1.0 - p) * 4294967296.0));
  const float scale = p < 1.0 ? static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
  at::Tensor mask = at::empty(local, at::TensorOptions().dtype(at::kFloat));
  fill_mask(mask.data_ptr<float>(), key, global_shape, slice, threshold, scale);
  return mask.to(device);
}

at::Tensor layout_invariant_dropout(const at::Tensor& x, double p, bool training, const DropoutKey& key,
                                    const std::vector<int64_t>& global_shape,
                                    const std::vector<std::pair<int64_t, int64_t>>& slice) {
  bool fits = static_cast<int64_t>(slice.size()) == x.dim();
  for (size_t d = 0; fits && d < slice.size(); ++d) {
    fits = slice[d].second - slice[d].first == x.size(static_cast<int64_t>(d));
  }
  if (!fits) {
    throw Error(ErrorCode::internal, "dropout: input of shape " + shape_str(x.sizes().vec()) +
                                         " is not the size of its slice " + slice_str(slice) +
                                         " of global shape " + shape_str(global_shape),
                "the slice's extents (end - begin per dim) must equal the input's sizes");
  }
  if (!training || p == 0.0) return x;
  const at::Tensor mask = dropout_keep_mask(key, global_shape, slice, p, x.device());
  return x.mul(mask.to(x.scalar_type()));
}

}  // namespace dtrain::engine::random
