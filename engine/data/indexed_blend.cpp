// open_indexed_training (indexed_blend.h): ShuffledSource maps a source's
// sample index to an epoch's window over its shuffled documents and reads it
// through IndexedTokens; IndexedTraining maps a global position to a source
// and index with BlendSchedule. Orders come from epoch_order (sampler.h).
#include "engine/data/indexed_blend.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <filesystem>

#include "common/error.h"
#include "engine/data/indexed_tokens.h"
#include "engine/data/sampler.h"

namespace dtrain::engine::data {

BlendSchedule::BlendSchedule(std::vector<double> weights) : weights_(std::move(weights)) {
  double sum = 0;
  for (double w : weights_) sum += w;
  if (weights_.empty() || !(sum > 0))
    throw Error(ErrorCode::config, "data.blend: the weights sum to " + std::to_string(sum) + ", not > 0",
                "give each source a weight > 0");
  for (double& w : weights_) w /= sum;
  drawn_.assign(weights_.size(), 0);
}

int BlendSchedule::pick() const {
  const double i = std::max(double(pos_), 1.0);
  int best = 0;
  double best_error = weights_[0] * i - double(drawn_[0]);
  for (size_t j = 1; j < weights_.size(); ++j) {
    const double error = weights_[j] * i - double(drawn_[j]);
    if (error > best_error) best_error = error, best = int(j);
  }
  return best;
}

void BlendSchedule::seek(int64_t position) const {
  if (position < pos_) {
    pos_ = 0;
    std::fill(drawn_.begin(), drawn_.end(), 0);
  }
  for (; pos_ < position; ++pos_) ++drawn_[size_t(pick())];
}

BlendSchedule::Draw BlendSchedule::at(int64_t position) const {
  seek(position);
  const int j = pick();
  return {j, drawn_[size_t(j)]};
}

std::vector<int64_t> BlendSchedule::drawn_before(int64_t position) const {
  seek(position);
  return drawn_;
}

namespace {

// One indexed dataset: its epoch e's stream is its documents in the order
// epoch_order(D, doc_seed, e); sample k is window sample_order[k % n] of epoch k / n.
class ShuffledSource {
 public:
  ShuffledSource(const std::string& prefix, int seq_len, int vocab, uint64_t seed)
      : tokens_(prefix, vocab), seq_len_(seq_len), doc_seed_(seed ^ 0x646f63756d656e74ULL),
        sample_seed_(seed ^ 0x73616d706c657321ULL) {
    num_samples_ = tokens_.num_tokens() < 1 ? 0 : (tokens_.num_tokens() - 1) / seq_len;
    if (num_samples_ < 1)
      throw Error(ErrorCode::config,
                  "data.path (format indexed): " + tokens_.header().idx_path + " lists " +
                      std::to_string(tokens_.num_tokens()) + " tokens, too few for one sample of seq_len + 1 = " +
                      std::to_string(seq_len + 1),
                  "use a larger dataset or a smaller model.seq_len");
  }
  int64_t num_samples() const { return num_samples_; }
  void check() const { tokens_.check(); }

  // The seq_len + 1 tokens of sample k (any k >= 0) into w.
  void read_sample(int64_t k, int64_t* w) const {
    const Epoch& ep = epoch(k / num_samples_);
    int64_t first = ep.sample_order[size_t(k % num_samples_)] * seq_len_, n = seq_len_ + 1;
    const std::vector<int64_t>& starts = tokens_.document_starts();
    // The shuffled document holding `first`, then document by document.
    size_t s = size_t(std::upper_bound(ep.cum.begin(), ep.cum.end(), first) - ep.cum.begin()) - 1;
    while (n > 0) {
      const int64_t doc = ep.doc_order[s];
      const int64_t k_here = std::min(n, ep.cum[s + 1] - first);
      if (k_here > 0) tokens_.read(starts[size_t(doc)] + (first - ep.cum[s]), k_here, w);
      first += k_here, w += k_here, n -= k_here, ++s;
    }
  }

 private:
  struct Epoch {
    int64_t e = -1;
    std::vector<int64_t> doc_order;     // [D] documents in this epoch's order
    std::vector<int64_t> cum;           // [D + 1] first token of each, in the epoch's stream
    std::vector<int64_t> sample_order;  // [n] window drawn k-th
  };
  // The two most recent epochs are kept: a batch may straddle a boundary.
  const Epoch& epoch(int64_t e) const {
    for (const Epoch& c : cache_)
      if (c.e == e) return c;
    Epoch& c = cache_[next_];
    next_ ^= 1;
    const std::vector<int64_t>& starts = tokens_.document_starts();
    const int64_t D = int64_t(starts.size()) - 1;
    c.doc_order = epoch_order(D, doc_seed_, e);
    c.cum.assign(size_t(D + 1), 0);
    for (int64_t i = 0; i < D; ++i) {
      const int64_t d = c.doc_order[size_t(i)];
      c.cum[size_t(i + 1)] = c.cum[size_t(i)] + starts[size_t(d + 1)] - starts[size_t(d)];
    }
    c.sample_order = epoch_order(num_samples_, sample_seed_, e);
    c.e = e;
    return c;
  }

  IndexedTokens tokens_;
  int seq_len_;
  uint64_t doc_seed_, sample_seed_;
  int64_t num_samples_ = 0;
  mutable Epoch cache_[2];
  mutable int next_ = 0;
};

class IndexedTraining final : public TokenDataset {
 public:
  IndexedTraining(const std::vector<IndexedSource>& sources, int seq_len, int vocab, uint64_t seed)
      : seq_len_(seq_len), batches_(weights(sources)), accounts_(weights(sources)) {
    for (size_t j = 0; j < sources.size(); ++j) {
      // Each source its own orders: seed mixed with its place in the blend.
      sources_.push_back(std::make_unique<ShuffledSource>(sources[j].prefix, seq_len, vocab,
                                                          seed + 0x9E3779B97F4A7C15ULL * uint64_t(j)));
      total_ += sources_.back()->num_samples();
      std::string name = std::filesystem::path(sources[j].prefix).filename().string();
      for (const std::string& other : names_)
        if (other == name) name += "#" + std::to_string(j);
      names_.push_back(name);
    }
  }
  int64_t num_samples() const override { return total_; }
  int seq_len() const override { return seq_len_; }
  bool orders_itself() const override { return true; }

  // B = batch (positions), T = seq_len.
  void get_batch(const std::vector<int64_t>& positions, at::Tensor& inputs, at::Tensor& targets) const override {
    for (const auto& s : sources_) s->check();
    const int64_t B = int64_t(positions.size()), T = seq_len_;
    if (!inputs.defined() || inputs.sizes() != at::IntArrayRef{B, T} || inputs.scalar_type() != at::kLong ||
        !inputs.is_contiguous() || !inputs.device().is_cpu())
      inputs = at::empty({B, T}, at::kLong);  // [B, T]
    if (!targets.defined() || targets.sizes() != at::IntArrayRef{B, T} || targets.scalar_type() != at::kLong ||
        !targets.is_contiguous() || !targets.device().is_cpu())
      targets = at::empty({B, T}, at::kLong);  // [B, T]
    int64_t* in = inputs.data_ptr<int64_t>();
    int64_t* tg = targets.data_ptr<int64_t>();
    std::vector<int64_t> w(size_t(T + 1));  // [T + 1]
    for (int64_t b = 0; b < B; ++b) {
      const int64_t g = positions[size_t(b)];
      if (g < 0) throw Error(ErrorCode::internal, "indexed data: position " + std::to_string(g) + " < 0");
      const BlendSchedule::Draw d = batches_.at(g);
      sources_[size_t(d.source)]->read_sample(d.index, w.data());
      std::copy(w.begin(), w.end() - 1, in + b * T);
      std::copy(w.begin() + 1, w.end(), tg + b * T);
    }
  }

  std::vector<std::pair<std::string, int64_t>> source_tokens(int64_t consumed) const override {
    const std::vector<int64_t> drawn = accounts_.drawn_before(consumed);
    std::vector<std::pair<std::string, int64_t>> out;
    for (size_t j = 0; j < names_.size(); ++j) out.emplace_back(names_[j], drawn[j] * seq_len_);
    return out;
  }

 private:
  static std::vector<double> weights(const std::vector<IndexedSource>& sources) {
    std::vector<double> w;
    for (const auto& s : sources) w.push_back(s.weight);
    return w;
  }
  int seq_len_;
  std::vector<std::unique_ptr<ShuffledSource>> sources_;
  std::vector<std::string> names_;
  int64_t total_ = 0;
  BlendSchedule batches_;   // the cursor get_batch moves
  BlendSchedule accounts_;  // the cursor source_tokens moves
};

}  // namespace

std::unique_ptr<TokenDataset> open_indexed_training(const std::vector<IndexedSource>& sources, int seq_len,
                                                    int vocab, uint64_t seed) {
  if (seq_len < 1 || vocab < 1)
    throw Error(ErrorCode::config, "data: seq_len = " + std::to_string(seq_len) + " and vocab = " +
                                       std::to_string(vocab) + " must be >= 1");
  return std::make_unique<IndexedTraining>(sources, seq_len, vocab, seed);
}

}  // namespace dtrain::engine::data
