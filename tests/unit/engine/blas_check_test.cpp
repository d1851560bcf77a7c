// The start-up BLAS check: a correct gemm passes, a gemm that executes an
// illegal instruction (a real SIGILL, from ud2) is caught and reported, a
// gemm with one wrong element fails, and at::mm passes. Where Debian's
// OpenBLAS is installed and the CPU lacks AVX-512, the real trap too:
// OPENBLAS_CORETYPE=SkylakeX, whose kernels this CPU cannot run.
#include <dlfcn.h>

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/machine_facts.h"
#include "engine/doctor/blas_check.h"
#include "tests/support/skip.h"

using dtrain::engine::doctor::check_gemm;
using dtrain::engine::doctor::GemmCheck;

namespace {

void naive(const float* a, const float* b, float* c, int m, int k, int n) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float s = 0;
      for (int p = 0; p < k; ++p) s += a[i * k + p] * b[p * n + j];
      c[i * n + j] = s;
    }
}

}  // namespace

TEST_CASE("blas check: a correct gemm passes, a trapping one and a wrong one fail") {
  GemmCheck good = check_gemm(naive);
  MESSAGE("naive fp32 loop: max rel err " << good.max_rel_err << " (tolerance " << GemmCheck::kTolerance << ")");
  CHECK(good.ok());

  GemmCheck trap = check_gemm([](const float*, const float*, float*, int, int, int) { __builtin_trap(); });
  CHECK(trap.illegal_instruction);
  CHECK_FALSE(trap.ok());
  std::string fix;
  const std::string msg =
      dtrain::engine::doctor::gemm_check_message(trap, {{"OPENBLAS_CORETYPE", "SkylakeX"}}, &fix);
  CHECK(msg.find("SIGILL") != std::string::npos);
  CHECK(msg.find("OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);
  CHECK(fix.find("unset OPENBLAS_CORETYPE") != std::string::npos);

  GemmCheck wrong = check_gemm([](const float* a, const float* b, float* c, int m, int k, int n) {
    naive(a, b, c, m, k, n);
    c[(m - 1) * n + n - 1] += 0.5f;  // one element off
  });
  MESSAGE("one wrong element: max rel err " << wrong.max_rel_err);
  CHECK_FALSE(wrong.illegal_instruction);
  CHECK(wrong.max_rel_err > 1e-3);
  CHECK_FALSE(wrong.ok());
  CHECK(dtrain::engine::doctor::gemm_check_message(wrong, {}, &fix).find("wrong") != std::string::npos);
  CHECK(fix.find("no kernel override is set") != std::string::npos);
}

TEST_CASE("blas check: LibTorch's sgemm passes") {
  GemmCheck c = dtrain::engine::doctor::check_libtorch_gemm_or_throw();
  MESSAGE("at::mm: max rel err " << c.max_rel_err << " (tolerance " << GemmCheck::kTolerance << ")");
  CHECK(c.ok());
}

TEST_CASE("blas check: OPENBLAS_CORETYPE=SkylakeX on a CPU without AVX-512 is caught") {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  const char* lib = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0";
  if (dtrain::cpu_flags_from_cpuinfo(text.str()).avx512f) {
    DTRAIN_SKIP(cpu, "this CPU has AVX-512, so SkylakeX kernels run here");
  }
  // OpenBLAS reads its variables when it loads: set them first. One thread,
  // so the kernel runs on this (guarded) thread.
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  unsetenv("OPENBLAS_CORETYPE");
  if (!h) {
    DTRAIN_SKIP(blas, lib << " is not installed (Debian's libopenblas0-pthread)");
  }
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
  using Str = char* (*)();
  auto sgemm = reinterpret_cast<Sgemm>(dlsym(h, "cblas_sgemm"));
  auto core = reinterpret_cast<Str>(dlsym(h, "openblas_get_corename"));
  REQUIRE(bool(sgemm));
  REQUIRE(bool(core));
  MESSAGE("OpenBLAS core: " << std::string(core()));
  REQUIRE(std::string(core()) == "SkylakeX");
  GemmCheck c = check_gemm([sgemm](const float* a, const float* b, float* out, int m, int k, int n) {
    sgemm(101, 111, 111, m, n, k, 1.0f, a, k, b, n, 0.0f, out, n);  // row-major, no transpose
  });
  CHECK(c.illegal_instruction);
  // The library may hold state from the interrupted call: it stays loaded, unused.
}
