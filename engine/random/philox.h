// Layout-invariant randomness (docs/ARCHITECTURE.md, 'Layout-invariant randomness'):
// Philox4x32-10 and a dropout whose mask bit for an element is a pure function
// of (seed, step, layer, site, the element's flat index in the GLOBAL tensor),
// so every DP/TP/PP/SP layout draws the same mask as one process, activation
// recomputation redraws it exactly, and resume needs no generator state.
// Does not own torch's generators (init, data order) nor the model's call sites.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace dtrain::engine::random {

// Philox4x32 with 10 rounds (Salmon et al., SC'11; Random123's philox4x32):
// a bijection of the 128-bit counter for each 64-bit key.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Each dropout call site of the model has its own stream; values are part of
// the mask's definition (changing one changes every mask drawn at that site).
enum class DropoutSite : uint8_t {
  embedding = 0,   // after token + position embedding, [B, T, C]
  attn_probs = 1,  // attention probabilities, [B, heads, T, T]
  attn_resid = 2,  // attention output projection before the residual add, [B, T, C]
  mlp_resid = 3,   // MLP output before the residual add, [B, T, C]
};

// Which stream a mask comes from. step: the optimizer step being computed, in
// [0, 2^32); layer: the GLOBAL block index (not the pipeline stage's local
// one), in [0, 2^24); the embedding site uses layer 0.
struct DropoutKey {
  uint64_t seed = 0;
  int64_t step = 0;
  int layer = 0;
  DropoutSite site = DropoutSite::embedding;
};

// The inverted-dropout multiplier for the part `slice` ({begin, end} per dim)
// of a tensor whose global shape is `global_shape`: a float tensor shaped like
// the slice, on `device`, each element 0 or 1/(1-p) (all ones for p = 0, all
// zeros for p = 1). Element e's bit: with idx = e's row-major flat index in
// global_shape, the philox block
//   counter = (idx/4 lo32, idx/4 hi32, step, layer << 8 | site), key = (seed lo32, seed hi32)
// lane idx % 4 is kept iff it is < round((1-p) * 2^32). Dim 0 of global_shape
// is the sample index within the step's global batch: the caller maps its
// local rows to global rows through `slice`. Computed on the CPU, then moved.
at::Tensor dropout_keep_mask(const DropoutKey& key, const std::vector<int64_t>& global_shape,
                             const std::vector<std::pair<int64_t, int64_t>>& slice, double p,
                             c10::Device device);

// x * dropout_keep_mask(...) in x's dtype and on x's device; x is the `slice`
// part of the global tensor (its sizes must equal the slice's extents). The
// mask does not require grad, so backward multiplies by the same mask.
// Returns x itself when !training or p == 0.
at::Tensor layout_invariant_dropout(const at::Tensor& x, double p, bool training, const DropoutKey& key,
                                    const std::vector<int64_t>& global_shape,
                                    const std::vector<std::pair<int64_t, int64_t>>& slice);

}  // namespace dtrain::engine::random
