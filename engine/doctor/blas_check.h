// The start-up check of the BLAS kernels: a small sgemm through LibTorch
// against a plain reference loop, under a SIGILL guard, so that a kernel
// override the CPU cannot run (OPENBLAS_CORETYPE=SkylakeX on a CPU without
// AVX-512) or one that computes wrong numbers stops the worker with the
// variable and the fix before training starts. Not a speed measurement.
#pragma once

#include <functional>
#include <map>
#include <string>

namespace dtrain::engine::doctor {

// C[m, n] = A[m, k] @ B[k, n], row-major fp32.
using GemmFn = std::function<void(const float* a, const float* b, float* c, int m, int k, int n)>;

struct GemmCheck {
  bool illegal_instruction = false;  // the gemm raised SIGILL
  double max_rel_err = 0;            // max |C - ref| / sum_k |A||B| over the checked shapes
  bool ok() const { return !illegal_instruction && max_rel_err <= kTolerance; }
  // fp32 rounding bounds the error by k * 2^-24 relative to sum_k |a||b|
  // (7.6e-6 at the largest k checked, 128); a wrong kernel is off by O(1).
  static constexpr double kTolerance = 1e-5;
};

// Runs `gemm` on a few shapes (odd edges and a 128^3 block) and compares.
// SIGILL raised on this thread is caught and reported, not fatal.
GemmCheck check_gemm(const GemmFn& gemm);

// The message of a failed check: what happened, and which of the set
// kernel variables (`overrides`, name -> value) to change. Pure.
std::string gemm_check_message(const GemmCheck& check, const std::map<std::string, std::string>& overrides,
                               std::string* fix);

// The BLAS and ATen variables that choose kernels, as set in this process's environment.
std::map<std::string, std::string> kernel_overrides();

// check_gemm over at::mm on the CPU; throws dtrain::Error(config) with
// gemm_check_message when it fails. Returns the check.
GemmCheck check_libtorch_gemm_or_throw();

}  // namespace dtrain::engine::doctor
