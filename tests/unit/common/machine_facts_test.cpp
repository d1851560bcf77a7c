// doctor_warnings on constructed facts (each trap beside the fact that
// clears it), the CPU flag parser, and the engine JSON round trip.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "common/error.h"
#include "common/machine_facts.h"

namespace {

using dtrain::DoctorWarning;
using dtrain::MachineFacts;

MachineFacts intel_avx512() {
  MachineFacts f;
  f.host.cpu_vendor = "GenuineIntel";
  f.host.cpu_model = "Intel(R) Xeon(R) Platinum 8375C";
  f.host.cores = 2;
  f.host.numa_nodes = 1;
  f.host.flags.avx = f.host.flags.avx2 = f.host.flags.fma = f.host.flags.avx512f = true;
  f.engine.available = true;
  f.engine.aten_cpu_capability = "AVX512";
  f.engine.blas.name = "openblas";
  f.engine.blas.core = "SkylakeX";
  f.engine.sgemm_fp32_gflops = 90;
  f.engine.sgemm_bf16_gflops = 120;
  return f;
}

const DoctorWarning* find(const std::vector<DoctorWarning>& ws, const std::string& code) {
  auto it = std::find_if(ws.begin(), ws.end(), [&](const auto& w) { return w.code == code; });
  return it == ws.end() ? nullptr : &*it;
}

}  // namespace

TEST_CASE("doctor: a clean machine has no warnings") {
  CHECK(dtrain::doctor_warnings(intel_avx512(), 2).empty());
}

TEST_CASE("doctor: a generic OpenBLAS core on a newer CPU names the core to force") {
  MachineFacts f = intel_avx512();
  f.engine.blas.core = "Prescott";
  auto ws = dtrain::doctor_warnings(f, 0);
  const DoctorWarning* w = find(ws, "generic_blas_core");
  REQUIRE(w);
  CHECK(w->message.find("Prescott") != std::string::npos);
  CHECK(w->message.find("AVX-512") != std::string::npos);
  CHECK(w->fix.find("OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);

  f.engine.blas.overrides["OPENBLAS_CORETYPE"] = "Prescott";  // the override is the cause: said so
  w = find(ws = dtrain::doctor_warnings(f, 0), "generic_blas_core");
  REQUIRE(w);
  CHECK(w->message.find("because OPENBLAS_CORETYPE=Prescott") != std::string::npos);

  f.host.cpu_vendor = "AuthenticAMD";  // AVX2 AMD: Zen
  f.host.flags.avx512f = false;
  w = find(ws = dtrain::doctor_warnings(f, 0), "generic_blas_core");
  REQUIRE(w);
  CHECK(w->fix.find("OPENBLAS_CORETYPE=Zen") != std::string::npos);

  f.engine.blas.core = "Zen";  // the right core: no warning
  CHECK(find(dtrain::doctor_warnings(f, 0), "generic_blas_core") == nullptr);
  f.engine.blas.core = "Haswell";  // AVX2 kernels on an AVX2 CPU: fine
  CHECK(find(dtrain::doctor_warnings(f, 0), "generic_blas_core") == nullptr);
}

TEST_CASE("doctor: MKL forced onto a compatible code path, and ATen below the CPU") {
  MachineFacts f = intel_avx512();
  f.engine.blas = {};
  f.engine.blas.name = "mkl";
  f.engine.blas.mkl_cbwr = 1;  // CBWR off: MKL's own dispatch
  CHECK(dtrain::doctor_warnings(f, 0).empty());
  f.engine.blas.mkl_cbwr = 3;  // COMPATIBLE
  f.engine.blas.core = "COMPATIBLE";
  f.engine.blas.overrides["MKL_CBWR"] = "COMPATIBLE";
  auto ws = dtrain::doctor_warnings(f, 0);
  const DoctorWarning* w = find(ws, "blas_code_path");
  REQUIRE(w);
  CHECK(w->fix == "unset MKL_CBWR (now COMPATIBLE)");
  f.engine.blas.mkl_cbwr = 12;  // AVX512 on an AVX-512 CPU
  CHECK(find(dtrain::doctor_warnings(f, 0), "blas_code_path") == nullptr);

  f.engine.aten_cpu_capability = "DEFAULT";
  f.engine.blas.overrides["ATEN_CPU_CAPABILITY"] = "default";
  w = find(ws = dtrain::doctor_warnings(f, 0), "aten_capability");
  REQUIRE(w);
  CHECK(w->fix == "unset ATEN_CPU_CAPABILITY (now default)");
}

TEST_CASE("doctor: more workers than cores, with the figures") {
  MachineFacts f = intel_avx512();
  auto ws = dtrain::doctor_warnings(f, 8);
  const DoctorWarning* w = find(ws, "workers_over_cores");
  REQUIRE(w);
  CHECK(w->message.find("8 workers on 2 cores") != std::string::npos);
  CHECK(w->message.find("0.25 of a core") != std::string::npos);
  CHECK(w->fix == "cluster.procs_per_node <= 2 on this machine");
  CHECK(find(dtrain::doctor_warnings(f, 2), "workers_over_cores") == nullptr);
  CHECK(find(dtrain::doctor_warnings(f, 0), "workers_over_cores") == nullptr);
}

TEST_CASE("doctor: bf16 slower than fp32, and a missing engine") {
  MachineFacts f = intel_avx512();
  f.engine.sgemm_bf16_gflops = 14.5;
  f.engine.sgemm_fp32_gflops = 52.0;
  auto ws = dtrain::doctor_warnings(f, 0);
  const DoctorWarning* w = find(ws, "bf16_slower");
  REQUIRE(w);
  CHECK(w->message.find("14.5 GFLOP/s, slower than fp32 at 52.0 (0.28x)") != std::string::npos);
  CHECK(w->message.find("neither avx512_bf16 nor AMX") != std::string::npos);
  f.engine.sgemm_bf16_gflops = 60;
  CHECK(find(dtrain::doctor_warnings(f, 0), "bf16_slower") == nullptr);

  f.engine = {};
  f.engine.error = "/x/dtrain-worker does not exist";
  ws = dtrain::doctor_warnings(f, 0);
  REQUIRE(ws.size() == 1);
  CHECK(ws[0].code == "no_engine");
  CHECK(ws[0].message.find("/x/dtrain-worker does not exist") != std::string::npos);
}

TEST_CASE("doctor: CPU flags from /proc/cpuinfo, whole words only") {
  auto f = dtrain::cpu_flags_from_cpuinfo(
      "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx avx2 fma avx512f avx512_bf16 amx_tile amx_bf16\n");
  CHECK(f.avx2);
  CHECK(f.avx512f);
  CHECK(f.avx512_bf16);
  CHECK(f.amx_tile);
  CHECK(f.amx_bf16);
  auto g = dtrain::cpu_flags_from_cpuinfo("flags\t\t: fpu avx avx512fx avx2x\n");
  CHECK(g.avx);
  CHECK_FALSE(g.avx2);
  CHECK_FALSE(g.avx512f);
}

TEST_CASE("doctor: engine facts JSON round trip and the document's schema") {
  MachineFacts f = intel_avx512();
  f.engine.blas.overrides["OPENBLAS_CORETYPE"] = "SkylakeX";
  f.engine.gpus.push_back({0, "NVIDIA H200", 150ull << 30, 9, 0});
  auto back = dtrain::engine_facts_from_json(dtrain::engine_facts_to_json(f.engine), "test");
  CHECK(back.blas.core == "SkylakeX");
  CHECK(back.blas.overrides.at("OPENBLAS_CORETYPE") == "SkylakeX");
  CHECK(back.sgemm_fp32_gflops == 90);
  REQUIRE(back.gpus.size() == 1);
  CHECK(back.gpus[0].sm_major == 9);
  CHECK(back.gpus[0].memory_bytes == 150ull << 30);
  CHECK_THROWS_AS(dtrain::engine_facts_from_json("{\"available\": true}", "w"), dtrain::Error);

  auto j = nlohmann::json::parse(dtrain::doctor_to_json(f, 8, dtrain::doctor_warnings(f, 8)));
  CHECK(j["schema"] == dtrain::kDoctorSchema);
  CHECK(j["workers"] == 8);
  CHECK(j["warnings"][0]["code"] == "workers_over_cores");
  CHECK(j["host"]["flags"]["avx512f"] == true);
  CHECK(j["summary"].get<std::string>().find("2 cores, 1 NUMA node, AVX2 FMA AVX-512") == 0);
}
