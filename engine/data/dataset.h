// Token sources (docs/ARCHITECTURE.md, 'The engine's folders'): byte-level text
// (vocab 256), uint16/uint32 token files, Megatron indexed datasets and a
// synthetic source. A sample i is the window of seq_len+1 tokens starting at
// a position fixed by i, so any rank can read any sample. Does not decide which rank reads which sample (sampler.h
// does).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::engine::data {

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  virtual int64_t num_samples() const = 0;   // windows of seq_len+1 tokens
  virtual int seq_len() const = 0;
  // Fill inputs[B, T] and targets[B, T] (int64) for the given sample ids.
  virtual void get_batch(const std::vector<int64_t>& sample_ids, at::Tensor& inputs,
                         at::Tensor& targets) const = 0;
  // True when the ids get_batch takes are global positions (the sampler's
  // consumed count + offset, any value >= 0) and the dataset orders its
  // samples itself (indexed_blend.h): the sampler then passes positions through.
  virtual bool orders_itself() const { return false; }
  // Tokens consumed per source (base name) once `consumed` positions were
  // drawn; empty when the dataset has no sources to tell apart.
  virtual std::vector<std::pair<std::string, int64_t>> source_tokens(int64_t /*consumed*/) const { return {}; }
};

// format: "bytes" (any file, one token per byte), "tokens-u16" / "tokens-u32"
// (little-endian uint16 / uint32), "indexed" (path is the prefix of a
// Megatron PREFIX.idx + PREFIX.bin pair), "synthetic" (deterministic from
// seed; path unused).
// Throws dtrain::Error(config) naming data.path when the file is missing or
// too short for one sample; get_batch throws it when the file changed
// (size or modification time) since open.
std::unique_ptr<TokenDataset> open_dataset(const std::string& format, const std::string& path,
                                           int seq_len, int vocab, uint64_t seed);

}  // namespace dtrain::engine::data
