// `dtrain ckpt import-hf HF_DIR OUT_DIR [--spec-out SPEC.yaml] [--set k=v]...`
// and `dtrain ckpt export-hf CKPT OUT_DIR [--dtype fp32|bf16]`: Hugging Face
// Llama / Mixtral weights in and out of dtrain checkpoints. The work is
// common/hf_io.h; this file is the command line and the summary lines.
#include <cstdio>
#include <iostream>
#include <memory>

#include "apps/dtrain/command.h"
#include "apps/dtrain/cmd_ckpt_hf.h"
#include "common/hf_io.h"
#include "common/safe_output.h"

namespace dtrain::app {
namespace {

std::string gb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GB", double(bytes) / 1e9);
  return buf;
}

int run_import(const std::string& hf_dir, const std::string& out_dir, const std::string& spec_out,
               const std::vector<std::string>& sets) {
  const JobSpec spec = hf::import_spec(hf_dir, sets);
  hf::check_import_target(out_dir, "OUT_DIR");
  std::unique_ptr<SafeOutput> spec_file;  // checked (and its temporary made) before any weight is read
  if (!spec_out.empty()) spec_file = std::make_unique<SafeOutput>(spec_out, "--spec-out", Clobber::refuse);
  const hf::ImportStats st = hf::import_checkpoint(hf_dir, spec, out_dir);
  if (spec_file) {
    spec_file->write(job_spec_to_yaml(spec));
    spec_file->commit();
  }
  std::cout << "imported " << hf_dir << " into " << st.step_dir << ": " << st.tensors << " tensors, "
            << gb(st.bytes) << " fp32 (weights only)" << (spec_out.empty() ? "" : "; job spec " + spec_out)
            << "\n";
  return 0;
}

int run_export(const std::string& ckpt, const std::string& out_dir, const hf::ExportOptions& o) {
  const hf::ExportStats st = hf::export_checkpoint(ckpt, out_dir, o);
  std::cout << "exported " << ckpt << " into " << out_dir << ": " << st.tensors << " tensors, " << gb(st.bytes)
            << " " << o.dtype << " in " << st.files << " safetensors file" << (st.files == 1 ? "" : "s") << "\n";
  return 0;
}

}  // namespace

void add_ckpt_hf(CLI::App& ckpt, int& exit_code) {
  struct ImportArgs {
    std::string hf_dir, out_dir, spec_out;
    std::vector<std::string> sets;
  };
  auto ia = std::make_shared<ImportArgs>();
  auto* imp = ckpt.add_subcommand("import-hf", "Hugging Face Llama / Mixtral weights to a dtrain checkpoint (step 0)");
  imp->add_option("hf_dir", ia->hf_dir, "directory with config.json and model.safetensors[.index.json]")->required();
  imp->add_option("out_dir", ia->out_dir, "new checkpoint directory (must not exist, or be empty)")->required();
  imp->add_option("--spec-out", ia->spec_out, "also write a job spec whose model section is this model");
  imp->add_option("--set", ia->sets, "override a spec field of --spec-out, e.g. --set model.seq_len=1024");
  imp->callback([ia, &exit_code] { exit_code = run_import(ia->hf_dir, ia->out_dir, ia->spec_out, ia->sets); });

  struct ExportArgs {
    std::string ckpt, out_dir;
    hf::ExportOptions options;
  };
  auto ea = std::make_shared<ExportArgs>();
  auto* exp = ckpt.add_subcommand("export-hf", "a llama checkpoint to a Hugging Face model directory");
  exp->add_option("ckpt", ea->ckpt, "checkpoint: a step_<N> dir or a run's checkpoint.dir")->required();
  exp->add_option("out_dir", ea->out_dir, "new directory (must not exist)")->required();
  exp->add_option("--dtype", ea->options.dtype, "fp32 (default) or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  // Hidden: the shard size (transformers' 5 GB), so a test can force shards.
  exp->add_option("--max-shard-bytes", ea->options.max_shard_bytes)->group("")->check(CLI::Range(uint64_t(1), UINT64_MAX));
  exp->callback([ea, &exit_code] { exit_code = run_export(ea->ckpt, ea->out_dir, ea->options); });
}

}  // namespace dtrain::app
