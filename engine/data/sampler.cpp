// DistributedSampler (sampler.h): which sample ids each DP rank and micro-step
// reads. The per-epoch order is a Fisher-Yates shuffle driven by splitmix64
// seeded from (seed, epoch): our own generator, so the order never changes
// with the LibTorch version. Does not read data (dataset.h does).
#include "engine/data/sampler.h"

#include "common/error.h"

#include <numeric>
#include <string>

namespace dtrain::engine::data {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): a tiny, well-mixed 64-bit generator.
uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias worth caring about (Lemire's
// multiply-shift; bias < bound / 2^64).
uint64_t below(uint64_t& state, uint64_t bound) {
  return uint64_t((unsigned __int128)splitmix64_next(state) * bound >> 64);
}

}  // namespace

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  uint64_t state = seed ^ (0xD1B54A32D192ED03ULL * uint64_t(epoch + 1));
  splitmix64_next(state);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = int64_t(below(state, uint64_t(i) + 1));
    std::swap(perm[size_t(i)], perm[size_t(j)]);
  }
  return perm;
}

DistributedSampler::DistributedSampler(int64_t num_samples, uint64_t seed, int dp_size, int dp_rank,
                                       int micro_batch, int grad_accum, bool shuffle)
    : num_samples_(num_samples),
      seed_(seed),
      dp_size_(dp_size),
      dp_rank_(dp_rank),
      micro_batch_(micro_batch),
      grad_accum_(grad_accum),
      shuffle_(shuffle) {
  if (num_samples < 1 || dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size || micro_batch < 1 ||
      grad_accum < 1) {
    throw Error(ErrorCode::config,
                "sampler: invalid sizes (num_samples " + std::to_string(num_samples) + ", dp " +
                    std::to_string(dp_size) + ", dp_rank " + std::to_string(dp_rank) + ", micro_batch " +
                    std::to_string(micro_batch) + ", grad_accum " + std::to_string(grad_accum) + ")",
                "num_samples, dp, micro_batch and grad_accum must be >= 1 and 0 <= dp_rank < dp");
  }
}

int64_t DistributedSampler::id_at(int64_t global_index) const {
  if (!shuffle_) return global_index;
  const int64_t epoch = global_index / num_samples_;
  if (epoch != cached_epoch_) {
    perm_ = epoch_order(num_samples_, seed_, epoch);  // depends on (seed, epoch) only
    cached_epoch_ = epoch;
  }
  return perm_[size_t(global_index % num_samples_)];
}

std::vector<int64_t> DistributedSampler::micro_batch_ids(int micro) const {
  if (micro < 0 || micro >= grad_accum_) {
    throw Error(ErrorCode::internal, "sampler: micro-step " + std::to_string(micro) +
                                         " outside [0, grad_accum = " + std::to_string(grad_accum_) + ")");
  }
  // This rank's slice of the global batch, then micro-step `micro`'s part.
  const int64_t per_rank = int64_t(micro_batch_) * grad_accum_;
  const int64_t first = state_.consumed + dp_rank_ * per_rank + int64_t(micro) * micro_batch_;
  std::vector<int64_t> ids(static_cast<size_t>(micro_batch_));
  for (int i = 0; i < micro_batch_; ++i) ids[size_t(i)] = id_at(first + i);
  return ids;
}

std::vector<int64_t> DistributedSampler::global_batch_ids() const {
  const int64_t n = global_batch();
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = id_at(state_.consumed + i);
  return ids;
}

void DistributedSampler::advance() { state_.consumed += global_batch(); }

int64_t DistributedSampler::epoch() const { return state_.consumed / num_samples_; }

}  // namespace dtrain::engine::data
