// bench/instep_gemm.sh's LD_PRELOAD shim for a dtrain worker: times every
// linear GEMM the engine calls through LibTorch's exported at::_ops::mm::call
// and at::_ops::addmm::call (the worker reaches them through its PLT, so this
// definition wins), and after every 50th such call times two 512^3 fp32
// matmuls on buffers of its own (the start-up probe's shape; the second is
// kept, warm) on the same thread. At exit it prints, per process,
//   INSTEP_GEMM pid P: in-step X GFLOP/s over N calls, probe beside them Y GFLOP/s
// so the steps' GEMMs are compared with what the core gave at the same moments.
// Wall time (steady_clock) for both. Built by bench/instep_gemm.sh against the
// venv's LibTorch; not part of dtrain.
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/randn.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double instep_flops, instep_s, probe_flops, probe_s;
long calls;

using Mm = at::Tensor (*)(const at::Tensor&, const at::Tensor&);
Mm real_mm() {
  static Mm f = reinterpret_cast<Mm>(dlsym(RTLD_NEXT, "_ZN2at4_ops2mm4callERKNS_6TensorES4_"));
  return f;
}

void probe() {
  static at::Tensor x, y;
  if (!x.defined()) x = at::randn({512, 512}), y = at::randn({512, 512});
  for (int i = 0; i < 2; ++i) {
    const double t = now();
    at::Tensor c = real_mm()(x, y);
    if (i == 1) probe_flops += 2.0 * 512 * 512 * 512, probe_s += now() - t;
  }
}

void tick(const at::Tensor& a, const at::Tensor& b, double s) {
  if (a.dim() != 2 || a.size(0) < 256) return;  // the model's token-by-feature GEMMs only
  instep_flops += 2.0 * double(a.size(0)) * double(a.size(1)) * double(b.size(1));
  instep_s += s;
  if (++calls % 50 == 0) probe();
}

struct Report {
  ~Report() {
    if (calls >= 100 && probe_s > 0)
      std::fprintf(stderr, "INSTEP_GEMM pid %d: in-step %.1f GFLOP/s over %ld calls, probe beside them %.1f GFLOP/s\n",
                   int(getpid()), instep_flops / instep_s / 1e9, calls, probe_flops / probe_s / 1e9);
  }
} report;

}  // namespace

at::Tensor at::_ops::mm::call(const at::Tensor& a, const at::Tensor& b) {
  const double t = now();
  at::Tensor r = real_mm()(a, b);
  tick(a, b, now() - t);
  return r;
}

at::Tensor at::_ops::addmm::call(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                                 const c10::Scalar& beta, const c10::Scalar& alpha) {
  using F = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, const c10::Scalar&,
                           const c10::Scalar&);
  static F real = reinterpret_cast<F>(dlsym(RTLD_NEXT, "_ZN2at4_ops5addmm4callERKNS_6TensorES4_S4_RKN3c106ScalarES8_"));
  const double t = now();
  at::Tensor r = real(self, a, b, beta, alpha);
  tick(a, b, now() - t);
  return r;
}
