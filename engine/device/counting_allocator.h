// Live and peak bytes of CPU tensors, measured: a c10 CPU allocator that
// forwards to the one LibTorch had and counts every allocation and free.
// Installed once per worker before the model exists, so parameters,
// gradients, optimizer state and activations all pass through it. Tensors
// made before install() are not counted. GPU memory is LibTorch's caching
// allocator's business, not this one's.
#pragma once

#include <cstdint>

namespace dtrain::engine::device {

// Makes the counting allocator LibTorch's CPU allocator (idempotent).
void install_counting_cpu_allocator();
bool counting_cpu_allocator_installed();

int64_t cpu_live_bytes();  // bytes of CPU tensor storage alive now
int64_t cpu_peak_bytes();  // the most alive at once since the last reset
void reset_cpu_peak();     // peak := live (e.g. at the start of a step)

}  // namespace dtrain::engine::device
