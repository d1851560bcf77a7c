// `dtrain ckpt inspect DIR` and `dtrain ckpt merge DIR OUT.safetensors
// [--with-optimizer]`: read a checkpoint through its index (no LibTorch).
// Inspect prints step, mesh, files and tensors and verifies every checksum;
// merge writes one file of full tensors, never over an existing file (unless
// --force), a link, or anything inside the checkpoint it reads, and leaves no
// temporary when it fails or is stopped by a signal. The format is
// common/checkpoint_*; the safe write is common/safe_output.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "apps/dtrain/cmd_ckpt_hf.h"
#include "apps/dtrain/command.h"
#include "common/checkpoint_dir.h"
#include "common/checkpoint_reader.h"
#include "common/safe_output.h"
#include "common/safetensors.h"

namespace dtrain::app {
namespace {

std::string mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", double(bytes) / 1e6);
  return buf;
}

int run_inspect(const std::string& path, bool verify) {
  const std::string dir = checkpoint::resolve(path);
  checkpoint::CheckpointReader reader(dir);
  const checkpoint::Index& x = reader.index();
  std::cout << "checkpoint " << dir << "\n"
            << "  step " << x.step << " | mesh " << x.mesh << " (world " << x.world << ")\n"
            << "  model " << x.model << "\n"
            << "  sampler consumed " << x.sampler_consumed << " samples | optimizer step "
            << x.optimizer_step << " | schedule lr " << x.schedule.lr << ", warmup "
            << x.schedule.warmup_steps << ", total " << x.schedule.total_steps << "\n"
            << "files:\n";
  for (const auto& f : x.files)
    std::cout << "  " << f << "  " << mb(std::filesystem::file_size(dir + "/" + f)) << "\n";
  std::cout << "tensors (" << x.tensors.size() << "):\n";
  for (const auto& t : x.tensors) {
    const uint64_t bytes = uint64_t(safetensors::numel(t.shape)) * safetensors::dtype_size(t.dtype);
    std::printf("  %-48s %-5s %-16s %12llu B  %zu shard(s)\n", t.name.c_str(), t.dtype.c_str(),
                checkpoint::shape_to_string(t.shape).c_str(), (unsigned long long)bytes, t.shards.size());
  }
  std::fflush(stdout);
  if (!verify) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t bytes = reader.verify_all();  // throws on the first bad shard
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t shards = 0;
  for (const auto& t : x.tensors) shards += t.shards.size();
  std::printf("verified %zu shard checksums (%s) in %.3f s: OK\n", shards, mb(bytes).c_str(), s);
  return 0;
}

int run_merge(const std::string& path, const std::string& out, bool with_optimizer, bool force) {
  const std::string dir = checkpoint::resolve(path);
  checkpoint::check_outside(out, "OUT", path, dir);
  // Checked (and the temporary created) before the shards are read.
  SafeOutput target(out, "OUT", force ? Clobber::replace : Clobber::refuse);
  RemoveTmpOnSignal cleanup(target);  // SIGTERM / SIGINT while merging leave no temporary
  auto stats = checkpoint::merge(dir, target.tmp_path(), with_optimizer);
  target.commit();
  std::cout << "merged " << dir << " into " << out << ": " << stats.tensors << " tensors, "
            << mb(stats.bytes) << (with_optimizer ? " (with optimizer state)" : "") << "\n";
  return 0;
}

void add_ckpt(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("ckpt", "inspect, merge, import or export checkpoints");
  cmd->require_subcommand(1);

  struct InspectArgs {
    std::string dir;
    bool no_verify = false;
  };
  auto ia = std::make_shared<InspectArgs>();
  auto* inspect = cmd->add_subcommand("inspect", "print step, mesh and tensors; verify every checksum");
  inspect->add_option("dir", ia->dir, "checkpoint: a step_<N> dir or a run's checkpoint.dir")->required();
  inspect->add_flag("--no-verify", ia->no_verify, "skip reading the shards");
  inspect->callback([ia, &exit_code] { exit_code = run_inspect(ia->dir, !ia->no_verify); });

  struct MergeArgs {
    std::string dir, out;
    bool with_optimizer = false;
    bool force = false;
  };
  auto ma = std::make_shared<MergeArgs>();
  auto* merge = cmd->add_subcommand("merge", "write one safetensors file of full tensors");
  merge->add_option("dir", ma->dir, "checkpoint: a step_<N> dir or a run's checkpoint.dir")->required();
  merge->add_option("out", ma->out, "output .safetensors file")->required();
  merge->add_flag("--with-optimizer", ma->with_optimizer,
                  "also write AdamW state as optim.exp_avg.<name> and optim.exp_avg_sq.<name>");
  merge->add_flag("--force", ma->force, "replace OUT when it is an existing file");
  merge->callback([ma, &exit_code] {
    exit_code = run_merge(ma->dir, ma->out, ma->with_optimizer, ma->force);
  });
  add_ckpt_hf(*cmd, exit_code);
}

}  // namespace

DTRAIN_REGISTER_COMMAND(70, add_ckpt);

}  // namespace dtrain::app
