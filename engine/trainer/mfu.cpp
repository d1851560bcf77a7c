// mfu.h: the FLOP count and the peak. On the CPU, ranks of one machine share
// its cores: a rank's share of its device is its per-thread rate times
// min(1, cores / local ranks), so 4 ranks on 2 cores count 2 cores' peak.
#include "engine/trainer/mfu.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "common/machine_memory.h"
#include "engine/doctor/engine_facts.h"

namespace dtrain::engine::trainer {

double model_flops_per_step(double params, const ModelSpec& m, double tokens_per_step) {
  return 6.0 * params * tokens_per_step +
         12.0 * double(m.layers) * double(m.d_model) * double(m.seq_len) * tokens_per_step;
}

namespace {

// The probe's matmul for `spec`'s precision on `device`: its dtype and n.
// bf16 on a CPU without bf16 units runs at a few GFLOP/s, so its matrix is
// smaller.
struct ProbeShape {
  at::ScalarType dtype;
  int n;
};
ProbeShape probe_shape(const JobSpec& spec, c10::Device device) {
  const auto dtype = spec.train.precision == Precision::bf16 ? at::kBFloat16 : at::kFloat;
  return {dtype, !device.is_cpu() ? 4096 : dtype == at::kBFloat16 ? 256 : 512};
}

// This process's matmul rate for `spec`'s precision on `device`. Short:
// every worker start pays it. Once per process and kind: a worker that
// recovers in place (a new round, the same device) keeps its first figure
// and starts training sooner; so does a warm spare that measured it.
double matmul_gflops(const JobSpec& spec, c10::Device device) {
  const auto [dtype, n] = probe_shape(spec, device);
  static std::map<std::pair<int, std::string>, double> measured;
  const auto key = std::make_pair(int(dtype), device.str());
  auto it = measured.find(key);
  if (it == measured.end())
    it = measured.emplace(key, doctor::measure_gemm_gflops(dtype, n, device.is_cpu() ? 0.06 : 0.3, device)).first;
  return it->second;
}

// Each rank's rate times its share of its device, summed over `control`, and
// every rank's rate gathered: one all-reduce.
DevicePeak sum_peak(double gflops, c10::Device device, int local_world, comm::Group& control) {
  DevicePeak p;
  p.measured_gflops = gflops;
  p.cores = usable_cpus();
  const double share = device.is_cpu() ? std::min(1.0, double(p.cores) / double(std::max(1, local_world))) : 1.0;
  p.rank_flops = p.measured_gflops * 1e9 * share;
  // One sum: slot `rank` holds this rank's rate, the last slot its share.
  const int world = control.size(), rank = control.rank();
  at::Tensor t = at::zeros({world + 1}, at::TensorOptions().dtype(at::kDouble));  // [world + 1]
  double* v = t.data_ptr<double>();
  v[rank] = p.measured_gflops;
  v[world] = p.rank_flops;
  control.all_reduce(t);  // in place: v holds the sums
  p.rank_gflops.assign(v, v + world);
  p.total_flops = v[world];
  return p;
}

}  // namespace

void premeasure_cpu_peak(const JobSpec& spec) {
  if (spec.cluster.device == DeviceKind::cpu) (void)matmul_gflops(spec, c10::Device(c10::DeviceType::CPU));
}

DevicePeak measure_device_peak(const JobSpec& spec, c10::Device device, int local_world,
                               comm::Group& control) {
  return sum_peak(matmul_gflops(spec, device), device, local_world, control);
}

LivePeak::LivePeak(const JobSpec& spec) {
  const auto [dtype, n] = probe_shape(spec, c10::Device(c10::kCPU));  // the start-up probe's
  at::Generator gen = at::detail::createCPUGenerator(5);  // not the run's generators
  a_ = at::randn({n, n}, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
  b_ = at::randn({n, n}, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
  c_ = at::mm(a_, b_);  // warm-up: pages touched, the kernel chosen
}

void LivePeak::sample() {
  // Twice, the second timed: after a step its inputs are out of cache, and
  // that first product runs 6-11% slower than the next ones (which agree
  // with each other), as no peak would.
  at::mm_out(c_, a_, b_);
  const double t0 = doctor::thread_cpu_s();
  at::mm_out(c_, a_, b_);
  seconds_ += doctor::thread_cpu_s() - t0;
  flops_ += 2.0 * double(a_.size(0)) * double(a_.size(0)) * double(a_.size(0));
}

double LivePeak::take_total_flops(c10::Device device, int local_world, comm::Group& control) {
  if (seconds_ <= 0) sample();  // a logged step with no sample since the last (none expected)
  const double gflops = flops_ / seconds_ / 1e9;
  flops_ = seconds_ = 0;
  return sum_peak(gflops, device, local_world, control).total_flops;
}

PeakSpread peak_spread(const std::vector<double>& rank_gflops, double slow_fraction) {
  PeakSpread s;
  if (rank_gflops.empty()) return s;
  std::vector<double> sorted = rank_gflops;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.min = sorted.front();
  s.max = sorted.back();
  s.median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  s.slowest_rank = int(std::min_element(rank_gflops.begin(), rank_gflops.end()) - rank_gflops.begin());
  s.slow = n > 1 && s.min < slow_fraction * s.median;
  return s;
}

}  // namespace dtrain::engine::trainer
