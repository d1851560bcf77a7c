// machine_facts.h: the warnings, the summary, the screen and the JSON of
// `dtrain doctor`. Pure functions over the facts; gathering the host's facts
// is host_facts.cpp, the engine's is engine/doctor/.
#include "common/machine_facts.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dtrain {
namespace {

using json = nlohmann::json;

// Vector ISA level: 1 SSE only, 2 AVX, 3 AVX2 (+FMA), 4 AVX-512.
int cpu_level(const CpuFlags& f) {
  if (f.avx512f) return 4;
  if (f.avx2) return 3;
  if (f.avx) return 2;
  return 1;
}

const char* level_name(int level) {
  switch (level) {
    case 4: return "AVX-512";
    case 3: return "AVX2";
    case 2: return "AVX";
    default: return "SSE";
  }
}

// OpenBLAS's DYNAMIC_ARCH core names by the vector ISA their kernels use;
// 0 = a name we do not know (no warning).
int openblas_core_level(const std::string& core) {
  std::string c = core;
  std::transform(c.begin(), c.end(), c.begin(), ::tolower);
  for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == n) return 4;
  for (const char* n : {"haswell", "zen", "excavator"})
    if (c == n) return 3;
  for (const char* n : {"sandybridge", "bulldozer", "piledriver", "steamroller"})
    if (c == n) return 2;
  for (const char* n : {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "katmai",
                        "coppermine", "northwood", "banias", "athlon", "opteron", "opteron_sse3",
                        "barcelona", "bobcat", "nano", "generic"})
    if (c == n) return 1;
  return 0;
}

// The OpenBLAS core that fits this CPU, for OPENBLAS_CORETYPE.
std::string openblas_core_for(const HostFacts& h) {
  const bool amd = h.cpu_vendor == "AuthenticAMD";
  switch (cpu_level(h.flags)) {
    case 4: return h.flags.avx512_bf16 && !amd ? "Cooperlake" : "SkylakeX";
    case 3: return amd ? "Zen" : "Haswell";
    case 2: return "Sandybridge";
    default: return "Prescott";
  }
}

// MKL's CBWR branch codes (mkl_cbwr_get) as ISA levels: 3 COMPATIBLE, 4 SSE2,
// 6 SSSE3, 7 SSE4_1, 8 SSE4_2 = 1; 9 AVX = 2; 10 AVX2 = 3; 11.. AVX-512 = 4;
// 0 off/auto/unknown.
int mkl_branch_level(int code) {
  if (code >= 3 && code <= 8) return 1;
  if (code == 9) return 2;
  if (code == 10) return 3;
  if (code >= 11) return 4;
  return 0;
}

int aten_level(const std::string& cap) {
  if (cap == "DEFAULT") return 1;
  if (cap == "AVX2") return 3;
  if (cap == "AVX512") return 4;
  return 0;
}

void blas_warnings(const MachineFacts& f, std::vector<DoctorWarning>& out) {
  const HostFacts& h = f.host;
  const BlasFacts& b = f.engine.blas;
  const int level = cpu_level(h.flags);
  if (b.name == "openblas") {
    const int core = openblas_core_level(b.core);
    if (core > 0 && core < level) {
      const std::string want = openblas_core_for(h);
      out.push_back({"generic_blas_core",
                     fmt::format("OpenBLAS runs its {} kernels ({} level) on a CPU with {} ({}){}",
                                 b.core, level_name(core), level_name(level), h.cpu_model,
                                 b.overrides.count("OPENBLAS_CORETYPE")
                                     ? " because OPENBLAS_CORETYPE=" + b.overrides.at("OPENBLAS_CORETYPE")
                                     : ""),
                     "export OPENBLAS_CORETYPE=" + want + " (read when the library loads)"});
    }
  }
  if (b.name == "mkl") {
    const int branch = mkl_branch_level(b.mkl_cbwr);
    if (branch > 0 && branch < level)
      out.push_back({"blas_code_path",
                     fmt::format("MKL runs a {} code path (CBWR branch {}: {}) on a CPU with {}",
                                 level_name(branch), b.mkl_cbwr, b.core, level_name(level)),
                     b.overrides.count("MKL_CBWR") ? "unset MKL_CBWR (now " + b.overrides.at("MKL_CBWR") + ")"
                                                   : "unset MKL_CBWR or set MKL_CBWR=AUTO"});
  }
  const int aten = aten_level(f.engine.aten_cpu_capability);
  if (aten > 0 && aten < std::min(level, 4))
    out.push_back({"aten_capability",
                   fmt::format("LibTorch's own kernels run at CPU capability {} on a CPU with {}",
                               f.engine.aten_cpu_capability, level_name(level)),
                   b.overrides.count("ATEN_CPU_CAPABILITY")
                       ? "unset ATEN_CPU_CAPABILITY (now " + b.overrides.at("ATEN_CPU_CAPABILITY") + ")"
                       : "use a LibTorch built with " + std::string(level_name(level)) + " kernels"});
}

}  // namespace

std::vector<DoctorWarning> doctor_warnings(const MachineFacts& f, int workers) {
  std::vector<DoctorWarning> out;
  if (!f.engine.available)
    out.push_back({"no_engine", "the engine's facts are missing: " + f.engine.error,
                   "build the dtrain-worker target next to dtrain"});
  else
    blas_warnings(f, out);
  if (f.engine.available && !f.engine.blas_check_error.empty())
    out.push_back({"blas_check_failed", f.engine.blas_check_error,
                   "training refuses to start until this is fixed (see the message)"});
  if (workers > 0 && f.host.cores > 0 && workers > f.host.cores)
    out.push_back({"workers_over_cores",
                   fmt::format("{} workers on {} cores: each rank gets {:.2f} of a core, and the "
                               "communication threads compete with compute",
                               workers, f.host.cores, double(f.host.cores) / workers),
                   fmt::format("cluster.procs_per_node <= {} on this machine", f.host.cores)});
  const EngineFacts& e = f.engine;
  if (e.available && e.sgemm_fp32_gflops > 0 && e.sgemm_bf16_gflops > 0 &&
      e.sgemm_bf16_gflops < e.sgemm_fp32_gflops)
    out.push_back({"bf16_slower",
                   fmt::format("bf16 matmul runs at {:.1f} GFLOP/s, slower than fp32 at {:.1f} "
                               "({:.2f}x){}",
                               e.sgemm_bf16_gflops, e.sgemm_fp32_gflops,
                               e.sgemm_bf16_gflops / e.sgemm_fp32_gflops,
                               f.host.flags.avx512_bf16 || f.host.flags.amx_bf16
                                   ? ""
                                   : "; this CPU has neither avx512_bf16 nor AMX"),
                   "train.precision: fp32 on this machine"});
  return out;
}

std::string doctor_summary(const MachineFacts& f) {
  const HostFacts& h = f.host;
  std::string flags;
  auto add = [&](bool on, const char* name) {
    if (on) flags += (flags.empty() ? "" : " ") + std::string(name);
  };
  add(h.flags.avx2, "AVX2");
  add(h.flags.fma, "FMA");
  add(h.flags.avx512f, "AVX-512");
  add(h.flags.avx512_bf16, "AVX512-BF16");
  add(h.flags.amx_tile, "AMX");
  if (flags.empty()) flags = "no AVX2";
  std::string out = fmt::format("{} cores, {} NUMA node{}, {}", h.cores, h.numa_nodes,
                                h.numa_nodes == 1 ? "" : "s", flags);
  const EngineFacts& e = f.engine;
  if (!e.available) return out;
  out += fmt::format("; {} {} ({})", e.blas.name, e.blas.version, e.blas.core.empty() ? "?" : e.blas.core);
  if (e.sgemm_fp32_gflops > 0)
    out += fmt::format("; sgemm {:.3g} GFLOP/s fp32, {:.3g} bf16 per thread", e.sgemm_fp32_gflops,
                       e.sgemm_bf16_gflops);
  out += "; torch " + e.torch_version;
  if (!e.gpus.empty()) out += fmt::format(", {} GPU{}", e.gpus.size(), e.gpus.size() == 1 ? "" : "s");
  return out;
}

std::string format_doctor(const MachineFacts& f, const std::vector<DoctorWarning>& warnings) {
  const HostFacts& h = f.host;
  const EngineFacts& e = f.engine;
  std::string s;
  s += fmt::format("host      {} ({} {})\n", h.hostname, h.cpu_vendor, h.cpu_model);
  s += fmt::format("cores     {} usable, {} NUMA node(s), {:.1f} GiB memory\n", h.cores, h.numa_nodes,
                   double(h.memory_bytes) / (1ULL << 30));
  s += fmt::format("cpu flags avx2 {} fma {} avx512f {} avx512_bf16 {} amx_tile {} amx_bf16 {}\n",
                   h.flags.avx2, h.flags.fma, h.flags.avx512f, h.flags.avx512_bf16, h.flags.amx_tile,
                   h.flags.amx_bf16);
  if (e.available) {
    s += fmt::format("libtorch  {} (CPU capability {}), CUDA {} ({}), NCCL {}\n", e.torch_version,
                     e.aten_cpu_capability, e.cuda_version.empty() ? "none" : e.cuda_version,
                     e.cuda_available ? "available" : "no device", e.nccl_version.empty() ? "none" : e.nccl_version);
    s += fmt::format("blas      {} {}, kernels {}{}{}\n", e.blas.name, e.blas.version, e.blas.core,
                     e.blas.config.empty() ? "" : ", config " + e.blas.config,
                     e.blas.library.empty() ? "" : ", " + e.blas.library);
    for (const auto& [k, v] : e.blas.overrides) s += fmt::format("          {}={} (set)\n", k, v);
    s += fmt::format("sgemm     {:.1f} GFLOP/s fp32, {:.1f} GFLOP/s bf16 (n={}, 1 thread, CPU time); "
                     "check against a plain loop: max rel err {:.1e}\n",
                     e.sgemm_fp32_gflops, e.sgemm_bf16_gflops, e.sgemm_n, e.blas_check_max_rel_err);
    for (const auto& g : e.gpus)
      s += fmt::format("gpu {}     {} sm_{}{} {:.1f} GiB\n", g.index, g.name, g.sm_major, g.sm_minor,
                       double(g.memory_bytes) / (1ULL << 30));
  } else {
    s += "engine    not measured: " + e.error + "\n";
  }
  for (const auto& n : h.interfaces)
    s += fmt::format("net       {:<10} {:<28} {}{}\n", n.name, n.address, n.up ? "up" : "down",
                     n.loopback ? " loopback" : "");
  for (const auto& w : warnings) s += fmt::format("warning   [{}] {}\n          fix: {}\n", w.code, w.message, w.fix);
  if (warnings.empty()) s += "warnings  none\n";
  return s;
}

std::string engine_facts_to_json(const EngineFacts& e) {
  json gpus = json::array();
  for (const auto& g : e.gpus)
    gpus.push_back({{"index", g.index}, {"name", g.name}, {"memory_bytes", g.memory_bytes},
                    {"sm", fmt::format("{}.{}", g.sm_major, g.sm_minor)}});
  json j = {{"available", e.available},
            {"error", e.error},
            {"torch_version", e.torch_version},
            {"cuda_version", e.cuda_version},
            {"cuda_available", e.cuda_available},
            {"nccl_version", e.nccl_version},
            {"aten_cpu_capability", e.aten_cpu_capability},
            {"blas",
             {{"name", e.blas.name}, {"version", e.blas.version}, {"core", e.blas.core},
              {"config", e.blas.config}, {"library", e.blas.library}, {"mkl_cbwr", e.blas.mkl_cbwr},
              {"overrides", e.blas.overrides}}},
            {"sgemm_n", e.sgemm_n},
            {"sgemm_fp32_gflops", e.sgemm_fp32_gflops},
            {"sgemm_bf16_gflops", e.sgemm_bf16_gflops},
            {"blas_check_max_rel_err", e.blas_check_max_rel_err},
            {"blas_check_error", e.blas_check_error},
            {"gpus", gpus}};
  return j.dump();
}

EngineFacts engine_facts_from_json(const std::string& text, const std::string& source) {
  EngineFacts e;
  try {
    json j = json::parse(text);
    e.available = j.at("available").get<bool>();
    e.error = j.at("error").get<std::string>();
    e.torch_version = j.at("torch_version").get<std::string>();
    e.cuda_version = j.at("cuda_version").get<std::string>();
    e.cuda_available = j.at("cuda_available").get<bool>();
    e.nccl_version = j.at("nccl_version").get<std::string>();
    e.aten_cpu_capability = j.at("aten_cpu_capability").get<std::string>();
    const json& b = j.at("blas");
    e.blas.name = b.at("name").get<std::string>();
    e.blas.version = b.at("version").get<std::string>();
    e.blas.core = b.at("core").get<std::string>();
    e.blas.config = b.at("config").get<std::string>();
    e.blas.library = b.at("library").get<std::string>();
    e.blas.mkl_cbwr = b.at("mkl_cbwr").get<int>();
    e.blas.overrides = b.at("overrides").get<std::map<std::string, std::string>>();
    e.sgemm_n = j.at("sgemm_n").get<int>();
    e.sgemm_fp32_gflops = j.at("sgemm_fp32_gflops").get<double>();
    e.sgemm_bf16_gflops = j.at("sgemm_bf16_gflops").get<double>();
    e.blas_check_max_rel_err = j.at("blas_check_max_rel_err").get<double>();
    e.blas_check_error = j.at("blas_check_error").get<std::string>();
    for (const json& g : j.at("gpus")) {
      GpuFacts gf;
      gf.index = g.at("index").get<int>();
      gf.name = g.at("name").get<std::string>();
      gf.memory_bytes = g.at("memory_bytes").get<uint64_t>();
      std::sscanf(g.at("sm").get<std::string>().c_str(), "%d.%d", &gf.sm_major, &gf.sm_minor);
      e.gpus.push_back(gf);
    }
  } catch (const json::exception& ex) {
    throw Error(ErrorCode::internal, source + " printed no engine facts JSON: " + ex.what(),
                "run it by hand to see its error");
  }
  return e;
}

std::string doctor_to_json(const MachineFacts& f, int workers, const std::vector<DoctorWarning>& warnings) {
  const HostFacts& h = f.host;
  json ifs = json::array();
  for (const auto& n : h.interfaces)
    ifs.push_back({{"name", n.name}, {"address", n.address}, {"up", n.up}, {"loopback", n.loopback}});
  json ws = json::array();
  for (const auto& w : warnings) ws.push_back({{"code", w.code}, {"message", w.message}, {"fix", w.fix}});
  json j = {{"schema", kDoctorSchema},
            {"host",
             {{"hostname", h.hostname}, {"cpu_vendor", h.cpu_vendor}, {"cpu_model", h.cpu_model},
              {"cores", h.cores}, {"numa_nodes", h.numa_nodes}, {"memory_bytes", h.memory_bytes},
              {"flags",
               {{"avx", h.flags.avx}, {"avx2", h.flags.avx2}, {"fma", h.flags.fma},
                {"avx512f", h.flags.avx512f}, {"avx512_bf16", h.flags.avx512_bf16},
                {"amx_tile", h.flags.amx_tile}, {"amx_bf16", h.flags.amx_bf16}}},
              {"interfaces", ifs}}},
            {"engine", json::parse(engine_facts_to_json(f.engine))},
            {"workers", workers},
            {"warnings", ws},
            {"summary", doctor_summary(f)}};
  return j.dump(2);
}

}  // namespace dtrain
