// A short matmul probe: the fp32 GEMM rate one worker thread gets on this
// device (the engine's own BLAS through at::mm), for `dtrain plan`'s step-time
// estimate. Measures only; caching is the CLI's.
#pragma once

namespace dtrain::engine::device {

// GFLOP/s of [n, n] x [n, n] fp32 products on the CPU, best of repeats over
// about `seconds`, one intra-op thread.
double probe_matmul_gflops(int n = 512, double seconds = 0.3);

}  // namespace dtrain::engine::device
