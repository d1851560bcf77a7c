// device.h: CUDA reached only through c10's DeviceGuardImplInterface, Event
// and at::Context, so this unit builds on a CPU-only LibTorch too.
#include "engine/device/device.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <mutex>

#include "common/error.h"

namespace dtrain::engine::device {

int cuda_device_count() {
  if (!at::hasCUDA()) return 0;
  return static_cast<int>(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount());
}

c10::Device select(const std::string& kind, int local_rank, int local_world) {
  if (kind == "cpu") return c10::Device(c10::DeviceType::CPU);
  if (kind != "cuda")
    throw Error(ErrorCode::config, "cluster.device = " + kind + " is unknown", "use cpu or cuda");
  const int n = cuda_device_count();
  if (n == 0)
    throw Error(ErrorCode::config,
                "cluster.device = cuda, but this worker sees no GPU (LibTorch " +
                    std::string(at::hasCUDA() ? "has CUDA; no device is visible"
                                              : "was built without CUDA or finds no driver") + ")",
                "use cluster.device cpu, or run on a machine with NVIDIA GPUs");
  if (local_world > n)
    throw Error(ErrorCode::config,
                "cluster.device = cuda with " + std::to_string(local_world) +
                    " workers on this node, but only " + std::to_string(n) + " GPU(s) are visible",
                "set cluster.procs_per_node to at most " + std::to_string(n) +
                    " (one worker per GPU; NCCL refuses two ranks on one GPU)");
  c10::Device d(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(local_rank));
  c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(d);
  return d;
}

void synchronize(c10::Device d) {
  if (d.is_cpu()) return;
  c10::impl::getDeviceGuardImpl(d.type())->synchronizeDevice(d.index());
}

struct StepTimer::Events {
  c10::Event begin{c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event end{c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT};
};

StepTimer::StepTimer(c10::Device d) : device_(d) {
  if (!d.is_cpu()) events_ = std::make_unique<Events>();
}

StepTimer::~StepTimer() = default;

void StepTimer::start() {
  t0_ = std::chrono::steady_clock::now();
  if (events_) {
    c10::impl::VirtualGuardImpl impl(device_.type());
    events_->begin.record(impl.getStream(device_));
  }
}

double StepTimer::stop_s() {
  if (!events_) return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  c10::impl::VirtualGuardImpl impl(device_.type());
  events_->end.record(impl.getStream(device_));
  events_->end.synchronize();
  return events_->begin.elapsedTime(events_->end) / 1000.0;  // ms -> s
}

std::string rng_kind(c10::Device d) { return d.is_cpu() ? "cpu" : "cuda"; }

at::Tensor rng_state(c10::Device d) {
  at::Generator gen = at::globalContext().defaultGenerator(d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(c10::Device d, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

at::Tensor to_host(const at::Tensor& t) {
  if (t.device().is_cpu()) return t.contiguous();
  at::Tensor host = at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
  host.copy_(t, /*non_blocking=*/true);
  synchronize(t.device());
  return host;
}

}  // namespace dtrain::engine::device
