// Model FLOPs utilisation: the model FLOPs of one step as PaLM's appendix B
// counts them (6 N per token for the parameter matmuls, forward and backward,
// plus 12 L H Q T per token for attention's T x T products), and the peak
// they are divided by: each rank's own measured matmul rate (engine/doctor),
// summed over the ranks. Owns neither the timing nor the logging (metrics.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/job_spec.h"
#include "engine/comm/comm.h"

namespace dtrain::engine::trainer {

// 6 * params * tokens + 12 * layers * d_model * seq_len * tokens, tokens =
// global batch * seq_len (H * Q = d_model). `params` is the whole model's.
double model_flops_per_step(double params, const ModelSpec& model, double tokens_per_step);

struct DevicePeak {
  double rank_flops = 0;   // this rank's share of its device: measured rate x min(1, cores / local ranks)
  double total_flops = 0;  // summed over all ranks (the MFU denominator)
  double measured_gflops = 0;  // the rate measured on this rank's thread / GPU
  int cores = 0;           // CPU cores this process may run on
  // Every rank's measured rate, gathered at start-up: a rank well below the
  // others (a throttled or shared core) sets a synchronous step's pace.
  std::vector<double> rank_gflops;
};

// The ranks' spread of measured matmul rates, for the start-up log: "min X
// (rank r), median Y, max Z GFLOP/s", and `slow` when the slowest rank is
// under `slow_fraction` of the median (that rank sets a synchronous step's
// pace, and MFU's denominator counts the others' faster rates).
struct PeakSpread {
  double min = 0, median = 0, max = 0;
  int slowest_rank = -1;
  bool slow = false;
};
PeakSpread peak_spread(const std::vector<double>& rank_gflops, double slow_fraction = 0.85);

// Measures this rank's matmul rate (fp32, or bf16 for train.precision bf16;
// n = 512 on the CPU (256 in bf16), 4096 on a GPU; about 0.06 s of CPU) on `device` and sums the shares over the control
// group, gathering every rank's rate (DevicePeak::rank_gflops). Collective:
// every rank calls it once, at start-up.
DevicePeak measure_device_peak(const JobSpec& spec, c10::Device device, int local_world,
                               comm::Group& control);

// log.live_peak (cluster.device cpu): the ranks' matmul rate measured
// beside the steps. sample() after every step runs two n^3 matmuls of the
// start-up probe's size (about 2 ms each at n 512 on these cores, outside
// the step's time) on inputs drawn once from a generator of its own and
// times the second (the first brings the inputs back into cache); at a
// logged step take_total_flops() turns the samples since the last logged
// step into this rank's mean rate there (their FLOPs over their thread CPU
// time) times its share of the cores, summed over the ranks: the cores'
// rate while the interval's steps ran, where the start-up figure is one
// 0.06 s window before the first.
class LivePeak {
 public:
  explicit LivePeak(const JobSpec& spec);
  void sample();
  // Collective over `control`: every rank calls it at the same logged steps.
  double take_total_flops(c10::Device device, int local_world, comm::Group& control);

 private:
  at::Tensor a_, b_, c_;  // [n, n] each
  double flops_ = 0, seconds_ = 0;
};

// The rate measure_device_peak takes, measured now for `spec`'s precision
// when it trains on the CPU (one thread): a warm spare measures while it
// waits for a rank, so that a restart does not (the figure is kept per
// process). Nothing for cluster.device cuda (a spare touches no GPU).
void premeasure_cpu_peak(const JobSpec& spec);

}  // namespace dtrain::engine::trainer
