// The worker's compute device (cpu, or one CUDA GPU per local rank) through
// c10's device-generic interfaces: choosing and binding it, synchronising,
// step timing (CUDA events on a GPU, the steady clock on the CPU), the
// device's RNG state for checkpoints, and host staging for checkpoint I/O.
// No CUDA headers: this compiles against any LibTorch, with or without CUDA.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>

namespace dtrain::engine::device {

// GPUs LibTorch can use here (0 without a driver or a CUDA LibTorch).
int cuda_device_count();

// cluster.device "cpu" -> CPU; "cuda" -> cuda:local_rank, made current.
// Throws dtrain::Error(config) naming cluster.device when there is no GPU or
// too few for the local ranks.
c10::Device select(const std::string& kind, int local_rank, int local_world);

// Waits until all work queued on `d` has finished (no-op on the CPU).
void synchronize(c10::Device d);

// Wall time of a region of device work: CUDA events on a GPU (no host sync
// until stop), the steady clock on the CPU.
class StepTimer {
 public:
  explicit StepTimer(c10::Device d);
  ~StepTimer();
  void start();
  double stop_s();  // seconds since start(); waits for the device's work

 private:
  struct Events;
  c10::Device device_;
  std::chrono::steady_clock::time_point t0_;
  std::unique_ptr<Events> events_;
};

// The default generator's state of `d` (CPU or that GPU), as a uint8 CPU tensor.
at::Tensor rng_state(c10::Device d);
void set_rng_state(c10::Device d, const at::Tensor& state);
// "cpu" or "cuda" (the checkpoint's RNG tensor names use it).
std::string rng_kind(c10::Device d);

// A CPU copy of `t` for writing (pinned memory when t is on a GPU, so the copy
// is a DMA); `t` itself when it is already a contiguous CPU tensor.
at::Tensor to_host(const at::Tensor& t);

}  // namespace dtrain::engine::device
