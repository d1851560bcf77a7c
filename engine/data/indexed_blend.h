// The training data of data.format indexed: one Megatron indexed dataset or
// a weighted blend of them (data.blend). Each source's documents are
// shuffled per epoch by (job seed, source, epoch), samples are windows of
// seq_len+1 tokens over that epoch's concatenated documents, drawn in a
// per-epoch shuffled order; sources interleave by Megatron's blending rule.
// Sample ids are global positions, so a position is the same tokens at any
// layout and after any resume. Evaluation data does not come through here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/dataset.h"

namespace dtrain::engine::data {

// Megatron's build_blending_indices (megatron/core/datasets/helpers.cpp):
// position i goes to the source j maximising weight_j * max(i, 1) - drawn_j
// (the first on ties), weights normalised to sum 1. Depends on i alone. A
// cursor moves forward from the last query (a query behind it restarts at 0),
// so increasing positions cost O(sources) each.
class BlendSchedule {
 public:
  explicit BlendSchedule(std::vector<double> weights);
  struct Draw {
    int source;
    int64_t index;  // samples drawn from that source before this one
  };
  Draw at(int64_t position) const;
  // Samples drawn from each source in positions [0, position).
  std::vector<int64_t> drawn_before(int64_t position) const;

 private:
  void seek(int64_t position) const;
  int pick() const;  // the source of position pos_
  std::vector<double> weights_;
  mutable int64_t pos_ = 0;
  mutable std::vector<int64_t> drawn_;
};

struct IndexedSource {
  std::string prefix;  // PREFIX of PREFIX.idx + PREFIX.bin
  double weight = 1;
};

// Throws dtrain::Error(config) naming the file when a source is missing,
// damaged, holds a token >= vocab, or has too few tokens for one sample.
std::unique_ptr<TokenDataset> open_indexed_training(const std::vector<IndexedSource>& sources, int seq_len,
                                                    int vocab, uint64_t seed);

}  // namespace dtrain::engine::data
