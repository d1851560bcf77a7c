// Context parallelism's sequence layout: a global sequence of T tokens is
// cut into 2N chunks of c = T / (2N) tokens; cp rank r holds chunk r and
// chunk 2N-1-r, concatenated in that order (local length 2c), so that every
// rank has the same share of causal attention's work. Owns the chunk math
// and the slicing of tensors; not the communication (ring_attention.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

namespace dtrain::engine::parallel::context {

// [begin, end) in global positions.
struct ChunkRange {
  int64_t begin = 0, end = 0;
};

// Throws dtrain::Error(internal) unless cp >= 1, 0 <= rank < cp and 2*cp
// divides T (the spec's validator rejects such lengths before launch).
void check_cp_layout(int64_t T, int cp, int rank);

// Rank r's two chunks in local order: {[r c, (r+1) c), [(2N-1-r) c, (2N-r) c)}.
std::array<ChunkRange, 2> cp_chunks(int64_t T, int cp, int rank);

// The global position of local position `local` (0 <= local < T / cp).
int64_t cp_global_position(int64_t local, int64_t T, int cp, int rank);

// Rank r's part of a full-length tensor: its two chunks along dim,
// concatenated (size T / cp along dim).
at::Tensor cp_local(const at::Tensor& full, int64_t dim, int cp, int rank);

// The inverse: every rank's local tensor (locals[r] from rank r, in rank
// order) back in global order along dim.
at::Tensor cp_full(const std::vector<at::Tensor>& locals, int64_t dim);
// The same from the rank-major concatenation along dim of every rank's
// local tensor (what an all-gather along that dim gives).
at::Tensor cp_full(const at::Tensor& gathered, int64_t dim, int cp);

}  // namespace dtrain::engine::parallel::context
