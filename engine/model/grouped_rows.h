// Grouped-query attention's row grouping, shared by the tiled kernel
// (tiled_attention.cpp) and ring attention (parallel/context/): a query
// tile holds, per k, v row, the G query heads' rows one after another, so
// one [BKV, G*ti, D] x [BKV, D, tj] matmul scores every head of a kv head
// without repeating k and v. Legend: BH = batch rows x heads, G = query
// heads per kv head, ti = a tile's length.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dtrain::engine::model::tile {

// Rows [i0, i0 + ti) of t [BH, T, ...] grouped: [BH/G, G*ti, ...] (t's own
// narrow view when G = 1, else a copy of the tile).
at::Tensor group_rows(const at::Tensor& t, int64_t G, int64_t i0, int64_t ti);

// Writes a grouped tile [BH/G, G*ti, ...] back to rows [i0, i0 + ti) of t.
void ungroup_rows(at::Tensor& t, int64_t G, int64_t i0, int64_t ti, const at::Tensor& tile);

}  // namespace dtrain::engine::model::tile
