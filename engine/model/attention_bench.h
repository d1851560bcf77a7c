// `dtrain-worker bench-attention`: one attention core (naive or tiled) forward
// + backward on random q, k, v, timed and with its peak live bytes from the
// counting allocator, one line of key=value results. Benchmarks only; the
// kernels are attention_core.h and tiled_attention.h.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain::engine::model {

struct AttentionBenchOptions {
  std::string kind = "tiled";  // naive | tiled
  int64_t seq = 1024, batch = 1, heads = 4, head_dim = 32;
  double dropout = 0.0;
  int iters = 3;  // timed repeats after one warm-up
};

int run_attention_bench(const AttentionBenchOptions& o);

}  // namespace dtrain::engine::model
