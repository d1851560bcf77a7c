// blas_check.h: the reference comparison and the SIGILL guard. The guard is
// a sigaction for SIGILL that siglongjmps back to check_gemm when the fault
// is on the checking thread; any other thread's SIGILL keeps its default
// (fatal) action. The previous handler is restored afterwards.
#include "engine/doctor/blas_check.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>

#include <csetjmp>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "common/error.h"
#include "common/log.h"

namespace dtrain::engine::doctor {
namespace {

thread_local sigjmp_buf* t_guard = nullptr;

void on_sigill(int sig) {
  if (t_guard) siglongjmp(*t_guard, sig);
  std::signal(SIGILL, SIG_DFL);  // not ours: the faulting instruction runs again and kills us
}

// The gemm of one shape, SIGILL-guarded. Returns false on SIGILL.
bool guarded(const GemmFn& gemm, const float* a, const float* b, float* c, int m, int k, int n) {
  struct sigaction sa{}, old{};
  sa.sa_handler = on_sigill;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGILL, &sa, &old);
  sigjmp_buf jb;
  bool ok = true;
  if (sigsetjmp(jb, 1) == 0) {
    t_guard = &jb;
    gemm(a, b, c, m, k, n);
  } else {
    ok = false;
  }
  t_guard = nullptr;
  sigaction(SIGILL, &old, nullptr);
  return ok;
}

}  // namespace

GemmCheck check_gemm(const GemmFn& gemm) {
  GemmCheck out;
  const int shapes[][3] = {{37, 53, 29}, {1, 17, 3}, {128, 128, 128}};
  uint32_t state = 12345;
  auto next = [&] {  // small LCG: values in [-1, 1)
    state = state * 1664525u + 1013904223u;
    return float(int32_t((state >> 8) % 2000u) - 1000) / 1000.0f;
  };
  for (const auto& s : shapes) {
    const int m = s[0], k = s[1], n = s[2];
    std::vector<float> a(size_t(m) * k), b(size_t(k) * n), c(size_t(m) * n, 0.f);
    for (auto& v : a) v = next();
    for (auto& v : b) v = next();
    if (!guarded(gemm, a.data(), b.data(), c.data(), m, k, n)) {
      out.illegal_instruction = true;
      return out;
    }
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double ref = 0, mag = 0;
        for (int p = 0; p < k; ++p) {
          ref += double(a[size_t(i) * k + p]) * double(b[size_t(p) * n + j]);
          mag += std::fabs(double(a[size_t(i) * k + p]) * double(b[size_t(p) * n + j]));
        }
        const double err = std::fabs(double(c[size_t(i) * n + j]) - ref) / (mag > 0 ? mag : 1.0);
        if (!(err <= out.max_rel_err)) out.max_rel_err = std::isnan(err) ? INFINITY : err;
      }
  }
  return out;
}

std::map<std::string, std::string> kernel_overrides() {
  std::map<std::string, std::string> out;
  for (const char* name : {"OPENBLAS_CORETYPE", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS",
                           "MKL_DEBUG_CPU_TYPE", "ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA",
                           "ONEDNN_MAX_CPU_ISA"})
    if (const char* v = std::getenv(name); v && *v) out[name] = v;
  return out;
}

std::string gemm_check_message(const GemmCheck& check, const std::map<std::string, std::string>& overrides,
                               std::string* fix) {
  std::string what = check.illegal_instruction
                         ? "the BLAS sgemm raised SIGILL (an instruction this CPU cannot run)"
                         : fmt::format("the BLAS sgemm is wrong: max relative error {:.3g} against a "
                                       "plain loop (tolerance {:.0e})",
                                       check.max_rel_err, GemmCheck::kTolerance);
  std::string set, unset;
  for (const auto& [k, v] : overrides) {
    set += (set.empty() ? "" : ", ") + k + "=" + v;
    unset += (unset.empty() ? "unset " : " and ") + k;
  }
  if (overrides.empty()) {
    *fix = "no kernel override is set (OPENBLAS_CORETYPE, MKL_CBWR, MKL_ENABLE_INSTRUCTIONS, "
           "ATEN_CPU_CAPABILITY): the BLAS library itself is broken on this CPU; run `dtrain doctor`";
    return what;
  }
  *fix = unset + (overrides.count("OPENBLAS_CORETYPE")
                      ? " (or name a core this CPU runs: `dtrain doctor` shows its flags, e.g. "
                        "OPENBLAS_CORETYPE=Haswell for AVX2)"
                      : "");
  return what + " with " + set + " set";
}

GemmCheck check_libtorch_gemm_or_throw() {
  const GemmCheck check = check_gemm([](const float* a, const float* b, float* c, int m, int k, int n) {
    auto opts = at::TensorOptions().dtype(at::kFloat);
    at::Tensor ta = at::from_blob(const_cast<float*>(a), {m, k}, opts);  // [m, k]
    at::Tensor tb = at::from_blob(const_cast<float*>(b), {k, n}, opts);  // [k, n]
    at::Tensor tc = at::from_blob(c, {m, n}, opts);                      // [m, n]
    at::mm_out(tc, ta, tb);
  });
  if (!check.ok()) {
    std::string fix;
    const std::string msg = gemm_check_message(check, kernel_overrides(), &fix);
    throw Error(ErrorCode::config, "start-up BLAS check failed: " + msg, fix);
  }
  return check;
}

}  // namespace dtrain::engine::doctor
