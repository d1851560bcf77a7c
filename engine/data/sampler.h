// The distributed, stateful sampler (docs/ARCHITECTURE.md, 'The parity
// recipe'): a deterministic shuffle per epoch from (seed, epoch); a step's
// global batch is the next `global_batch` samples of that order, whatever the
// layout; DP rank d takes its contiguous slice, and micro-step k a sub-slice of
// that. The position is a global count of samples consumed, so resuming on
// another dp neither repeats nor skips data.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain::engine::data {

// The order of epoch `epoch` of n items: a Fisher-Yates shuffle driven by
// splitmix64 from (seed, epoch) alone, so any rank computes it.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

struct SamplerState {
  int64_t consumed = 0;  // global samples consumed since the start of training
};

class DistributedSampler {
 public:
  // shuffle false: ids are the global positions themselves (consumed + i),
  // for a dataset that orders its samples itself (TokenDataset::orders_itself).
  DistributedSampler(int64_t num_samples, uint64_t seed, int dp_size, int dp_rank,
                     int micro_batch, int grad_accum, bool shuffle = true);

  // Sample ids of micro-step `micro` (0..grad_accum-1) of the current step
  // for this dp rank: micro_batch ids.
  std::vector<int64_t> micro_batch_ids(int micro) const;
  // Every id of the current step's global batch, in order (for tests / 1-proc).
  std::vector<int64_t> global_batch_ids() const;
  void advance();  // to the next step: consumed += global_batch

  int64_t global_batch() const { return int64_t(micro_batch_) * grad_accum_ * dp_size_; }
  int64_t epoch() const;  // epoch of the current step's first sample
  SamplerState state() const { return state_; }
  void load_state(const SamplerState& s) { state_ = s; }

 private:
  int64_t id_at(int64_t global_index) const;  // permutation of the epoch, cached
  int64_t num_samples_;
  uint64_t seed_;
  int dp_size_, dp_rank_, micro_batch_, grad_accum_;
  bool shuffle_ = true;
  SamplerState state_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

}  // namespace dtrain::engine::data
