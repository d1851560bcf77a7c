// engine_facts.h: the probe. BLAS: OpenBLAS is looked up in every loaded
// object (dl_iterate_phdr, then dlsym of openblas_get_corename/config in it),
// MKL through the symbols libtorch_cpu exports (MKL_Get_Version_String,
// mkl_serv_cbwr_get). GPUs: the CUDA driver API through dlopen, so this file
// needs no CUDA headers.
#include "engine/doctor/engine_facts.h"

#include <dlfcn.h>
#include <link.h>
#include <time.h>

#include <ATen/Version.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "engine/device/device.h"
#include "engine/doctor/blas_check.h"

namespace dtrain::engine::doctor {
namespace {

int collect_openblas(dl_phdr_info* info, size_t, void* out) {
  const std::string name = info->dlpi_name ? info->dlpi_name : "";
  if (name.find("openblas") != std::string::npos) *static_cast<std::string*>(out) = name;
  return 0;
}

// MKL_CBWR branch codes (mkl_cbwr.h) by name.
std::string cbwr_name(int code) {
  switch (code) {
    case 1: return "CBWR off: MKL's own CPU dispatch";
    case 2: return "AUTO";
    case 3: return "COMPATIBLE";
    case 4: return "SSE2";
    case 6: return "SSSE3";
    case 7: return "SSE4_1";
    case 8: return "SSE4_2";
    case 9: return "AVX";
    case 10: return "AVX2";
    case 12: return "AVX512";
    case 14: return "AVX512_E1";
    default: return "branch " + std::to_string(code);
  }
}

std::string config_value(const std::string& config, const std::string& key) {
  auto at = config.find(key + "=");
  if (at == std::string::npos) return "";
  auto end = config.find_first_of(", \n", at);
  return config.substr(at + key.size() + 1, end == std::string::npos ? std::string::npos : end - at - key.size() - 1);
}

double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string nccl_version() {
  using Fn = int (*)(int*);
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  int v = 0;
  if (!fn || fn(&v) != 0 || v <= 0) return "";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

std::vector<GpuFacts> gpus() {
  std::vector<GpuFacts> out;
  if (device::cuda_device_count() == 0) return out;
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!cuda) cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cuda) return out;
  using Init = int (*)(unsigned);
  using Count = int (*)(int*);
  using Get = int (*)(int*, int);
  using Name = int (*)(char*, int, int);
  using Mem = int (*)(size_t*, int);
  using Attr = int (*)(int*, int, int);
  auto init = reinterpret_cast<Init>(dlsym(cuda, "cuInit"));
  auto count = reinterpret_cast<Count>(dlsym(cuda, "cuDeviceGetCount"));
  auto get = reinterpret_cast<Get>(dlsym(cuda, "cuDeviceGet"));
  auto name = reinterpret_cast<Name>(dlsym(cuda, "cuDeviceGetName"));
  auto mem = reinterpret_cast<Mem>(dlsym(cuda, "cuDeviceTotalMem_v2"));
  auto attr = reinterpret_cast<Attr>(dlsym(cuda, "cuDeviceGetAttribute"));
  int n = 0;
  if (!init || !count || !get || !name || !mem || !attr || init(0) != 0 || count(&n) != 0) return out;
  for (int i = 0; i < n; ++i) {
    int dev = 0;
    if (get(&dev, i) != 0) continue;
    GpuFacts g;
    g.index = i;
    char buf[256] = {};
    if (name(buf, sizeof buf, dev) == 0) g.name = buf;
    size_t bytes = 0;
    if (mem(&bytes, dev) == 0) g.memory_bytes = bytes;
    attr(&g.sm_major, 75, dev);  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    attr(&g.sm_minor, 76, dev);  // ..._MINOR
    out.push_back(g);
  }
  return out;
}

}  // namespace

BlasFacts blas_facts() {
  BlasFacts b;
  b.name = "unknown";
  b.overrides = kernel_overrides();
  using Str = char* (*)();
  std::string lib;
  dl_iterate_phdr(collect_openblas, &lib);
  void* handle = lib.empty() ? RTLD_DEFAULT : dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (auto corename = reinterpret_cast<Str>(dlsym(handle ? handle : RTLD_DEFAULT, "openblas_get_corename"))) {
    auto config = reinterpret_cast<Str>(dlsym(handle ? handle : RTLD_DEFAULT, "openblas_get_config"));
    b.name = "openblas";
    b.library = lib;
    b.core = corename() ? corename() : "";
    b.config = config && config() ? config() : "";
    auto sp = b.config.find(' ');  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
    if (sp != std::string::npos) b.version = b.config.substr(sp + 1, b.config.find(' ', sp + 1) - sp - 1);
    return b;
  }
  using Version = void (*)(char*, int);
  using Cbwr = int (*)(int);
  if (auto version = reinterpret_cast<Version>(dlsym(RTLD_DEFAULT, "MKL_Get_Version_String"))) {
    char buf[256] = {};
    version(buf, sizeof buf);
    std::string v = buf;
    b.name = "mkl";
    b.config = v;
    auto at = v.find("Version ");
    b.version = at == std::string::npos ? v : v.substr(at + 8, v.find_first_of("- ", at + 8) - at - 8);
    auto cbwr = reinterpret_cast<Cbwr>(dlsym(RTLD_DEFAULT, "mkl_cbwr_get"));
    if (!cbwr) cbwr = reinterpret_cast<Cbwr>(dlsym(RTLD_DEFAULT, "mkl_serv_cbwr_get"));
    if (cbwr) {
      b.mkl_cbwr = cbwr(1);  // MKL_CBWR_BRANCH
      b.core = cbwr_name(b.mkl_cbwr);
    }
  }
  return b;
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double measure_gemm_gflops(c10::ScalarType dtype, int n, double seconds, c10::Device device) {
  auto opts = at::TensorOptions().dtype(dtype).device(device);
  at::Tensor a = at::randn({n, n}, opts);  // [n, n]
  at::Tensor b = at::randn({n, n}, opts);  // [n, n]
  at::Tensor c = at::mm(a, b);             // warm-up: kernels chosen, pages touched
  device::synchronize(device);
  const bool cpu = device.is_cpu();
  auto clock = [&] { return cpu ? thread_cpu_s() : wall_s(); };
  const double flops = 2.0 * double(n) * n * n;
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    int reps = 0;
    const double t0 = clock();
    double t = t0;
    while (t - t0 < seconds / 3 || reps == 0) {
      at::mm_out(c, a, b);
      if (!cpu && ++reps % 8 != 0) continue;
      if (cpu) ++reps;
      device::synchronize(device);
      t = clock();
    }
    if (t > t0) best = std::max(best, flops * reps / (t - t0) / 1e9);
  }
  return best;
}

EngineFacts probe_engine(double seconds) {
  EngineFacts e;
  e.available = true;
  e.torch_version = fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
  const std::string config = at::show_config();
  e.cuda_version = config_value(config, "CUDA_VERSION");
  e.cuda_available = device::cuda_device_count() > 0;
  e.nccl_version = nccl_version();
  e.aten_cpu_capability = at::get_cpu_capability();
  e.blas = blas_facts();
  try {
    e.blas_check_max_rel_err = check_libtorch_gemm_or_throw().max_rel_err;
  } catch (const Error& err) {
    e.blas_check_error = err.message() + "; fix: " + err.hint();
    return e;  // timing kernels that fault or compute garbage would say nothing
  }
  e.sgemm_n = 512;
  e.sgemm_fp32_gflops = measure_gemm_gflops(at::kFloat, e.sgemm_n, seconds, c10::Device(c10::kCPU));
  e.sgemm_bf16_gflops = measure_gemm_gflops(at::kBFloat16, e.sgemm_n, seconds, c10::Device(c10::kCPU));
  e.gpus = gpus();
  return e;
}

}  // namespace dtrain::engine::doctor
