// The engine's half of `dtrain doctor` (common/machine_facts.h): which BLAS
// LibTorch loaded and the kernels it picked (OpenBLAS's corename and config,
// MKL's version and code-path setting, found with dlsym in the loaded
// libraries), LibTorch/CUDA/NCCL versions, GPUs, and matmul rates measured
// on this thread. Reads the kernel-choosing variables of the environment to
// report them; it changes nothing.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "common/machine_facts.h"

namespace dtrain::engine::doctor {

BlasFacts blas_facts();

// This thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID): what the
// matmul probes time on the CPU.
double thread_cpu_s();

// GFLOP/s of C = A @ B (n x n) in `dtype` on `device`, repeated for about
// `seconds`: on the CPU per second of this thread's CPU time (time-slicing by
// other processes does not count; one intra-op thread), on a GPU per second
// of wall time between synchronisations. The best of 3 rounds.
double measure_gemm_gflops(c10::ScalarType dtype, int n, double seconds, c10::Device device);

// Everything above, plus the start-up BLAS check's error. `seconds` is the
// budget of each rate measurement.
EngineFacts probe_engine(double seconds);

}  // namespace dtrain::engine::doctor
