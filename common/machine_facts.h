// What `dtrain doctor` knows about a machine, as plain data: the host's facts
// (cores, NUMA nodes, CPU flags, network interfaces; read by the CLI without
// LibTorch) and the engine's (BLAS and the kernels it picked, measured sgemm
// rates, LibTorch/CUDA/NCCL versions, GPUs; measured by `dtrain-worker doctor`,
// which prints them as JSON). Also the pure function that turns facts into
// warnings, the one-line summary and the screen. Gathering lives elsewhere.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain {

struct CpuFlags {
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false;
};

struct NetInterface {
  std::string name;
  std::string address;  // numeric IPv4 or IPv6
  bool up = false;
  bool loopback = false;
};

struct HostFacts {
  std::string hostname;
  std::string cpu_vendor;  // GenuineIntel, AuthenticAMD, ...
  std::string cpu_model;
  int cores = 0;           // logical CPUs this process may run on (affinity)
  int numa_nodes = 0;
  uint64_t memory_bytes = 0;
  CpuFlags flags;
  std::vector<NetInterface> interfaces;
};

struct BlasFacts {
  std::string name;     // "openblas", "mkl" or "unknown"
  std::string version;
  std::string core;     // OpenBLAS: openblas_get_corename(); MKL: the CBWR branch
  std::string config;   // OpenBLAS: openblas_get_config()
  std::string library;  // the loaded file the symbols came from ("" = inside libtorch_cpu)
  int mkl_cbwr = 0;     // MKL's code path setting (mkl_cbwr_get): 1 off, 2 auto, 3 compatible, 4.. ISA
  std::map<std::string, std::string> overrides;  // BLAS/ATen variables set in the environment
};

struct GpuFacts {
  int index = 0;
  std::string name;
  uint64_t memory_bytes = 0;
  int sm_major = 0, sm_minor = 0;
};

struct EngineFacts {
  bool available = false;  // false: dtrain-worker did not run (error says why)
  std::string error;
  std::string torch_version;
  std::string cuda_version;  // LibTorch's CUDA build ("" = none)
  bool cuda_available = false;
  std::string nccl_version;
  std::string aten_cpu_capability;  // DEFAULT, AVX2, AVX512
  BlasFacts blas;
  int sgemm_n = 0;                  // square size measured
  double sgemm_fp32_gflops = 0;     // one thread, per second of this thread's CPU time
  double sgemm_bf16_gflops = 0;
  double blas_check_max_rel_err = 0;  // at::mm against a plain loop
  std::string blas_check_error;       // "" = the check passed; else what failed and the fix
  std::vector<GpuFacts> gpus;
};

struct MachineFacts {
  HostFacts host;
  EngineFacts engine;
};

struct DoctorWarning {
  std::string code;     // blas_check_failed, generic_blas_core, blas_code_path, aten_capability, workers_over_cores, bf16_slower, no_engine
  std::string message;  // with the figures
  std::string fix;
};

constexpr const char* kDoctorSchema = "dtrain.doctor/1";

// The traps the facts show, for `workers` ranks on this machine (0 = not
// asked). Pure: the tests call it with constructed facts.
std::vector<DoctorWarning> doctor_warnings(const MachineFacts& facts, int workers);

// "2 cores, 1 NUMA node, AVX2 FMA; mkl 2024.2 (auto); sgemm 52 GFLOP/s fp32, 14 bf16; torch 2.15.0"
std::string doctor_summary(const MachineFacts& facts);
// The one screen of `dtrain doctor`.
std::string format_doctor(const MachineFacts& facts, const std::vector<DoctorWarning>& warnings);

// JSON: {"schema", "host", "engine", "workers", "warnings", "summary"}.
std::string doctor_to_json(const MachineFacts& facts, int workers,
                           const std::vector<DoctorWarning>& warnings);
std::string engine_facts_to_json(const EngineFacts& engine);
// Throws dtrain::Error(internal) naming `source` when the text is not the
// engine's JSON.
EngineFacts engine_facts_from_json(const std::string& text, const std::string& source);

// Reads /proc, /sys and the interfaces of this machine. No LibTorch.
HostFacts gather_host_facts();
CpuFlags cpu_flags_from_cpuinfo(const std::string& cpuinfo_text);

}  // namespace dtrain
