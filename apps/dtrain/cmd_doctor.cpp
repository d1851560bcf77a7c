// `dtrain doctor [SPEC] [-n N] [--format text|json]`: this machine's facts on
// one screen (cores, NUMA, CPU flags, the BLAS LibTorch uses and its kernels,
// measured sgemm rates, versions, GPUs, network interfaces) and the traps they
// show. The engine's part comes from `dtrain-worker doctor` (LibTorch stays
// out of this binary); the warnings are common/machine_facts.h's.
#include <iostream>
#include <memory>

#include "apps/dtrain/command.h"
#include "common/machine_facts.h"
#include "launcher/doctor.h"
#include "launcher/launch.h"

namespace dtrain::app {
namespace {

struct DoctorOptions {
  std::string spec;
  std::vector<std::string> sets;
  int workers = 0;
  std::string format = "text";
  double seconds = 0.4;
};

void run_doctor(const DoctorOptions& o) {
  int workers = o.workers;
  if (!o.spec.empty() && workers == 0) workers = load_job_spec(o.spec, o.sets, nullptr).cluster.procs_per_node;
  MachineFacts f;
  f.host = gather_host_facts();
  f.engine = launcher::engine_facts_from_worker(launcher::self_dir() + "/dtrain-worker", o.seconds);
  const auto warnings = doctor_warnings(f, workers);
  if (o.format == "json")
    std::cout << doctor_to_json(f, workers, warnings) << "\n";
  else
    std::cout << format_doctor(f, warnings) << "summary   " << doctor_summary(f) << "\n";
}

void add_doctor(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<DoctorOptions>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "Show what this machine really does (cores, BLAS kernels, measured sgemm, versions) "
                "and the traps it can see");
  cmd->add_option("spec", opts->spec, "Job spec (YAML): checks its cluster.procs_per_node against the cores");
  cmd->add_option("--set", opts->sets, "Override a spec field: key.path=value (repeatable)");
  cmd->add_option("-n,--workers", opts->workers, "workers to check against the cores (default: the spec's)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--seconds", opts->seconds, "CPU seconds per sgemm measurement (fp32, bf16)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 60.0));
  cmd->add_option("--format", opts->format, "Output format")->check(CLI::IsMember({"text", "json"}));
  cmd->callback([opts, &exit_code] {
    run_doctor(*opts);
    exit_code = 0;
  });
}

}  // namespace
}  // namespace dtrain::app

DTRAIN_REGISTER_COMMAND(45, dtrain::app::add_doctor);
