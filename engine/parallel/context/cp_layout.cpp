// cp_layout.h: the load-balanced chunk layout of context parallelism and the
// tensor slicing that follows it.
#include "engine/parallel/context/cp_layout.h"

#include <ATen/ops/cat.h>

#include <string>

#include "common/error.h"

namespace dtrain::engine::parallel::context {

void check_cp_layout(int64_t T, int cp, int rank) {
  if (cp < 1 || rank < 0 || rank >= cp || T < 0 || T % (2 * int64_t{cp}) != 0)
    throw Error(ErrorCode::internal,
                "context parallel layout: sequence length " + std::to_string(T) + ", cp " + std::to_string(cp) +
                    ", rank " + std::to_string(rank) + ": needs cp >= 1, 0 <= rank < cp and 2*cp dividing the length",
                "use a sequence length that is a multiple of 2*cp = " + std::to_string(2 * int64_t{cp}));
}

std::array<ChunkRange, 2> cp_chunks(int64_t T, int cp, int rank) {
  check_cp_layout(T, cp, rank);
  const int64_t c = T / (2 * int64_t{cp});
  const int64_t hi = 2 * int64_t{cp} - 1 - rank;
  return {ChunkRange{rank * c, (rank + 1) * c}, ChunkRange{hi * c, (hi + 1) * c}};
}

int64_t cp_global_position(int64_t local, int64_t T, int cp, int rank) {
  const std::array<ChunkRange, 2> ch = cp_chunks(T, cp, rank);
  const int64_t c = ch[0].end - ch[0].begin;
  if (local < 0 || local >= 2 * c)
    throw Error(ErrorCode::internal, "context parallel layout: local position " + std::to_string(local) +
                                         " outside [0, " + std::to_string(2 * c) + ")");
  return local < c ? ch[0].begin + local : ch[1].begin + (local - c);
}

at::Tensor cp_local(const at::Tensor& full, int64_t dim, int cp, int rank) {
  const std::array<ChunkRange, 2> ch = cp_chunks(full.size(dim), cp, rank);
  return at::cat({full.narrow(dim, ch[0].begin, ch[0].end - ch[0].begin),
                  full.narrow(dim, ch[1].begin, ch[1].end - ch[1].begin)},
                 dim);
}

at::Tensor cp_full(const std::vector<at::Tensor>& locals, int64_t dim) {
  const int cp = static_cast<int>(locals.size());
  if (cp == 0) throw Error(ErrorCode::internal, "cp_full: no local tensors");
  const int64_t local_len = locals[0].size(dim);
  check_cp_layout(local_len * cp, cp, 0);
  const int64_t c = local_len / 2;
  std::vector<at::Tensor> chunks;  // global chunk j: rank j's first half, or rank 2N-1-j's second
  for (int j = 0; j < 2 * cp; ++j) {
    const at::Tensor& l = locals[static_cast<size_t>(j < cp ? j : 2 * cp - 1 - j)];
    if (l.size(dim) != local_len)
      throw Error(ErrorCode::internal, "cp_full: local tensors of different lengths along dim " +
                                           std::to_string(dim) + " (" + std::to_string(l.size(dim)) + " and " +
                                           std::to_string(local_len) + ")");
    chunks.push_back(l.narrow(dim, j < cp ? 0 : c, c));
  }
  return at::cat(chunks, dim);
}

at::Tensor cp_full(const at::Tensor& gathered, int64_t dim, int cp) {
  check_cp_layout(gathered.size(dim), cp, 0);
  return cp_full(gathered.chunk(cp, dim), dim);
}

}  // namespace dtrain::engine::parallel::context
