// AdamW's fused update as one loop over a flat run of fp32 elements (a
// whole tensor, or several whose parameters, gradients and moments each lie
// end to end: a ZeRO shard with flat moments). No LibTorch here: adamw.cpp
// decides what forms a run; this file only owns the loops (and the gradient
// norm's sum of squares, vectorised the same way).
#pragma once

#include <cstdint>

namespace dtrain::engine::optim::kernel {

// Per-step constants, rounded to fp32 once (as the ATen path's scalars are).
struct AdamWScalars {
  float decay;  // 1 - lr * weight_decay (1 = none)
  float b1, one_minus_b1, b2, one_minus_b2;
  float bc2_sqrt;  // sqrt(1 - b2^t)
  float eps;
  float neg_step;  // -lr / (1 - b1^t)
  // Each gradient element is multiplied by this first (the gradient-clip
  // factor, so no separate pass scales the gradients; 1 = none). The same
  // fp32 product as at::mul_(g, factor) writes: the same bits.
  float grad_scale = 1.0f;
};

// p, m, v updated in place over n elements from g. Compiled for AVX2 and
// for baseline x86-64, picked at load time; neither contracts to fused
// multiply-adds, so both round exactly as the per-tensor scalar pass does.
void adamw_run(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
               int64_t n, const AdamWScalars& s);

// Sum of squares of n floats in fp64, in one read of the data (at::sum(g *
// g, kDouble) writes g * g and an fp64 copy of it first). The first 4q
// elements (q = 8 * floor(n / 32)) as four quarters read side by side, each
// into eight accumulators (element i of quarter s into acc[s][i % 8]); the
// rest into acc[0][0] in order; combined in a fixed order (adamw_kernel.cpp),
// so every build (AVX2: 4-wide vectors; baseline: 2-wide) gives the same bits.
double sq_sum(const float* p, int64_t n);

}  // namespace dtrain::engine::optim::kernel
