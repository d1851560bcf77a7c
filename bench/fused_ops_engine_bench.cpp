// Each fused CPU kernel of engine/model/fused_ops.h against the ATen
// composition it replaces, one at a time, forward + backward at the
// compute-bound size's shapes (B*T = 512 rows of d_model 512; SwiGLU's F
// and GELU's width = 4 * 512), interleaved rounds, CPU time of this thread (time-slicing by
// other processes does not count), one intra-op thread as in training.
// Prints ms per call of each, the ratio fused / ATen and the median ratio.
// (A lone LayerNorm is not here: fused_norm runs ATen's for it.) Two rows
// compare something else in the same columns, as their names say: the fc
// layer + bias + GELU as one node (fused_linear_gelu) against addmm then
// the GELU kernel (what the model ran before it), and the GELU kernel at
// AVX-512 against itself at AVX2 (kernel calls only, no autograd; the row
// says so where the CPU lacks AVX-512); and the strided attention's score
// GEMM + causal softmax forward and backward (attention_core.cpp) against
// the baddbmm with the -inf bias + ATen's softmax it replaced.
//   build/bench/fused_ops_engine_bench [rounds=7] [iters=50] [rows=512] [C=512]
#include <time.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "engine/model/fused_kernels.h"
#include "engine/model/fused_ops.h"
#include "engine/model/llama.h"

namespace model = dtrain::engine::model;

namespace {

double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double time_ms(const std::function<void()>& f, int iters) {
  f();  // warm: allocator, caches
  const double t0 = cpu_s();
  for (int i = 0; i < iters; ++i) f();
  return 1e3 * (cpu_s() - t0) / iters;
}

struct Case {
  std::string name;
  std::function<void()> fused, aten;
};

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7, iters = argc > 2 ? std::atoi(argv[2]) : 50;
  const int64_t N = argc > 3 ? std::atoll(argv[3]) : 512, C = argc > 4 ? std::atoll(argv[4]) : 512;
  at::set_num_threads(1);
  auto leaf = [](std::vector<int64_t> s) { return at::randn(s).requires_grad_(true); };
  at::Tensor x = leaf({N, C}), r = leaf({N, C}), w = leaf({C}), b = leaf({C}), gu = leaf({N, 8 * C}), fc = leaf({N, 4 * C});
  const at::Tensor gy = at::randn({N, C}), gf = at::randn({N, 4 * C});
  const model::NormParams ln{w, b, 1e-5, false}, rms{w, at::Tensor(), 1e-5, true};
  auto rms_aten = [&](const at::Tensor& h) {  // RmsNormImpl::forward
    const at::Tensor x32 = h.to(at::kFloat);
    return w * (x32 * at::rsqrt(x32.pow(2).mean(-1, true) + 1e-5)).to(h.scalar_type());
  };
  // Each: forward, then backward of a loss reading every output.
  std::vector<Case> cases = {
      {"residual add + LayerNorm",
       [&] { auto [h, y] = model::fused_add_norm(x, r, ln); ((y * gy).sum() + (h * gy).sum()).backward(); },
       [&] { at::Tensor h = x + r; ((at::layer_norm(h, {C}, w, b, 1e-5) * gy).sum() + (h * gy).sum()).backward(); }},
      {"RMSNorm", [&] { (model::fused_norm(x, rms) * gy).sum().backward(); },
       [&] { (rms_aten(x) * gy).sum().backward(); }},
      {"residual add + RMSNorm",
       [&] { auto [h, y] = model::fused_add_norm(x, r, rms); ((y * gy).sum() + (h * gy).sum()).backward(); },
       [&] { at::Tensor h = x + r; ((rms_aten(h) * gy).sum() + (h * gy).sum()).backward(); }},
      {"SwiGLU", [&] { (model::fused_swiglu(gu) * gf).sum().backward(); },
       [&] { (model::swiglu(gu) * gf).sum().backward(); }},
      {"GELU", [&] { (model::fused_gelu(fc) * gf).sum().backward(); }, [&] { (at::gelu(fc) * gf).sum().backward(); }},
      {"GELU forward only",
       [&] {
         at::NoGradGuard ng;
         model::fused_gelu(fc);
       },
       [&] {
         at::NoGradGuard ng;
         at::gelu(fc);
       }},
  };
  // fc: x [N, C] -> [N, 4C] with its bias, then GELU; grads of x, W and b.
  // W at the model's init scale (std 1 / sqrt(C)): with randn's std 1 the
  // pre-activations reach |x| ~ 100, the GELU's tails underflow to
  // subnormals, and the GEMMs that read them run several times slower.
  at::Tensor fw = (at::randn({4 * C, C}) / std::sqrt(double(C))).requires_grad_(true), fb = leaf({4 * C});
  cases.push_back({"fc+bias+GELU vs addmm,GELU",
                   [&] { (model::fused_linear_gelu(x, fw, fb) * gf).sum().backward(); },
                   [&] { (model::fused_gelu(at::addmm(fb, x, fw.t())) * gf).sum().backward(); }});
  using model::kernels::VecIsa;
  const at::Tensor gx = fc.detach().contiguous(), gdy = gf.contiguous();  // (outlive the cases)
  at::Tensor gy_out = at::empty_like(gx), gdx = at::empty_like(gx);
  if (model::kernels::isa_available(VecIsa::avx512)) {
    auto kernel = [&, n = gx.numel()](VecIsa isa) {
      model::kernels::gelu_forward(gx.const_data_ptr<float>(), gy_out.mutable_data_ptr<float>(), n, isa);
      model::kernels::gelu_backward(gdy.const_data_ptr<float>(), gx.const_data_ptr<float>(),
                                    gdx.mutable_data_ptr<float>(), n, isa);
    };
    cases.push_back({"GELU kernel AVX-512 vs AVX2", [&, kernel] { kernel(VecIsa::avx512); },
                     [&, kernel] { kernel(VecIsa::avx2); }});
  } else {
    std::printf("# GELU kernel AVX-512 vs AVX2: not run, this CPU has no AVX-512 (F + DQ)\n");
  }
  // The strided attention's scores and softmax at B 4, H 8, T 128, D 64,
  // per batch row as attention_core.cpp runs them: q k^T by bmm and the
  // causal softmax kernel (forward, then backward in place) against
  // baddbmm with the -inf bias and the 1/sqrt(D) scale, ATen's softmax and
  // _softmax_backward_data (the path before; DTRAIN_CAUSAL_SOFTMAX=0).
  const int64_t AB = 4, AH = 8, AT = 128, AD = 64;
  const at::Tensor aq = at::randn({AB, AH, AT, AD}), ak = at::randn({AB, AH, AT, AD});
  const at::Tensor adp = at::randn({AB, AH, AT, AT});
  const at::Tensor abias = at::full({AT, AT}, -INFINITY).triu(1).expand({AH, AT, AT});
  at::Tensor aatt = at::empty({AB, AH, AT, AT}), ads = at::empty({AB, AH, AT, AT});
  const double ascale = 1.0 / std::sqrt(double(AD));
  cases.push_back({"attn scores+causal softmax",
                   [&] {
                     for (int64_t b = 0; b < AB; ++b) {
                       at::Tensor att_b = aatt[b];
                       at::bmm_out(att_b, aq[b], ak[b].transpose(1, 2));
                     }
                     float* p = aatt.mutable_data_ptr<float>();
                     model::kernels::causal_softmax_forward(p, p, AB * AH * AT, AT, float(ascale));
                     ads.copy_(adp);
                     float* d = ads.mutable_data_ptr<float>();
                     model::kernels::causal_softmax_backward(d, p, d, AB * AH * AT, AT);
                   },
                   [&] {
                     for (int64_t b = 0; b < AB; ++b) {
                       at::Tensor att_b = aatt[b];
                       at::baddbmm_out(att_b, abias, aq[b], ak[b].transpose(1, 2), 1.0, ascale);
                     }
                     const at::Tensor p = at::softmax(aatt, -1);
                     ads.copy_(at::_softmax_backward_data(adp, p, -1, at::kFloat));
                   }});
  cases.push_back({"causal softmax alone",
                   [&] {
                     float* p = aatt.mutable_data_ptr<float>();
                     model::kernels::causal_softmax_forward(p, p, AB * AH * AT, AT, float(ascale));
                     float* d = ads.mutable_data_ptr<float>();
                     model::kernels::causal_softmax_backward(adp.const_data_ptr<float>(), p, d, AB * AH * AT, AT);
                   },
                   [&] {
                     const at::Tensor p = at::softmax(aatt, -1);
                     at::_softmax_backward_data_out(ads, adp, p, -1, at::kFloat);
                   }});
  std::printf("# fused_ops_engine_bench: %d rounds x %d calls, rows %lld, C %lld (SwiGLU F %lld), 1 thread,\n"
              "# forward + backward (incl. the loss's mul/sum, same on both sides), thread CPU ms per call\n",
              rounds, iters, (long long)N, (long long)C, (long long)(4 * C));
  std::printf("%-26s %10s %10s %8s   per-round ratios\n", "kernel", "fused ms", "ATen ms", "ratio");
  for (const Case& c : cases) {
    std::vector<double> f, a, ratio;
    for (int k = 0; k < rounds; ++k) {  // alternate which side runs first
      const bool fused_first = k % 2 == 0;
      const double t1 = time_ms(fused_first ? c.fused : c.aten, iters);
      const double t2 = time_ms(fused_first ? c.aten : c.fused, iters);
      f.push_back(fused_first ? t1 : t2), a.push_back(fused_first ? t2 : t1);
      ratio.push_back(f.back() / a.back());
    }
    std::vector<double> sf = f, sa = a, sr = ratio;
    std::sort(sf.begin(), sf.end()), std::sort(sa.begin(), sa.end()), std::sort(sr.begin(), sr.end());
    std::printf("%-26s %10.3f %10.3f %8.3f  ", c.name.c_str(), sf[sf.size() / 2], sa[sa.size() / 2], sr[sr.size() / 2]);
    for (double v : ratio) std::printf(" %.3f", v);
    std::printf("\n");
  }
  return 0;
}
