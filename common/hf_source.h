// The tensors of a Hugging Face model directory: model.safetensors or the
// shards a model.safetensors.index.json maps, opened (headers only) and
// checked against dtrain's parameter table, plus the dtype conversions import
// needs. Reading config.json; no tensor data is read here.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/hf_llama.h"
#include "common/safetensors.h"

namespace dtrain::hf {

// HF_DIR/config.json's text; throws dtrain::Error(config) when there is none.
std::string read_config(const std::string& hf_dir);

struct SourceTensor {
  const safetensors::File* file = nullptr;
  safetensors::TensorInfo info;
};

class HfSource {
 public:
  // Opens every safetensors file of hf_dir (links followed: the HF cache
  // links its snapshots to blobs). Throws dtrain::Error(config) naming the
  // file when none is there or one cannot be read as safetensors.
  explicit HfSource(const std::string& hf_dir);
  // Throws dtrain::Error(config) listing, with file and tensor name, every
  // tensor of `params` that is missing or has another shape or a dtype other
  // than F32, BF16 or F16, and every tensor no parameter takes (the rotary
  // inv_freq buffers, and lm_head when tied, are ignored).
  void check(const std::vector<LlamaParam>& params, bool tied) const;
  const SourceTensor& at(const std::string& name) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<safetensors::File>> files_;
  std::map<std::string, SourceTensor> tensors_;
};

// n elements of safetensors dtype F32, BF16 or F16 at src (little-endian,
// unaligned allowed) to fp32: bf16 is the top half of an fp32; fp16 is
// widened exactly (subnormals, inf and NaN included).
void to_fp32(const std::string& dtype, const void* src, float* dst, size_t n);
// fp32 to bf16, rounding to nearest even as torch does; NaN stays NaN.
void to_bf16(const float* src, uint16_t* dst, size_t n);

}  // namespace dtrain::hf
