// The flat, padded, sharded layout ZeRO works on (docs/ARCHITECTURE.md, 'Data
// parallelism: DDP and ZeRO-1/2/3'): the parameters are grouped in units (a
// transformer block, the embeddings, the head); each unit is one flat buffer,
// its parameters back to back in registration order, padded with zeros to a
// multiple of the dp size n, and rank r owns the contiguous shard [r * S,
// (r + 1) * S) of it (S = padded / n). Where a shard cuts a parameter, the piece
// this rank owns is a flat range of that parameter, which a checkpoint stores
// as rectangular slices. Pure arithmetic: no tensors, no communication.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::engine::parallel::zero {

struct FlatUnit {
  std::vector<int> params;       // indices into the layout's parameter list, in order
  std::vector<int64_t> offsets;  // element offset of each in the flat buffer
  int64_t numel = 0;             // sum of the parameters' sizes
  int64_t padded = 0;            // numel rounded up to a multiple of n (>= n)
  int64_t shard = 0;             // padded / n: every rank's shard size
};

// The part of one parameter inside this rank's shard of its unit.
struct Piece {
  int unit = 0;
  int param = 0;
  int64_t begin = 0, end = 0;  // flat range [begin, end) of the parameter
  int64_t shard_offset = 0;    // where it starts in this rank's shard
};

struct FlatLayout {
  int n = 1, rank = 0;
  std::vector<FlatUnit> units;
  std::vector<Piece> pieces;  // this rank's, by unit, then parameter order
};

// unit_of[i]: the unit of parameter i (units numbered 0..max, each non-empty
// and holding consecutive parameters is not required). numel[i]: its size.
FlatLayout make_flat_layout(const std::vector<int64_t>& numel, const std::vector<int>& unit_of, int n,
                            int rank);

using Range = std::pair<int64_t, int64_t>;  // [begin, end) along one dim

// The rectangular blocks that together are the flat (row-major) element
// range [begin, end) of a tensor of `shape`, in flat order; at most 2 per
// dimension plus one. A 0-dim tensor is one block with no ranges.
std::vector<std::vector<Range>> flat_range_blocks(const std::vector<int64_t>& shape, int64_t begin,
                                                  int64_t end);

}  // namespace dtrain::engine::parallel::zero
