// `dtrain resume --ckpt DIR [--set k=v]...`: continue a run from a
// checkpoint. DIR is a run's checkpoint.dir (its `latest`) or one step_<N>;
// the spec is the one stored in the checkpoint, with overrides (more steps,
// another mesh). CLI only: the format is common/, launching is launcher/.
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "apps/dtrain/command.h"
#include "common/checkpoint_dir.h"
#include "common/checkpoint_reader.h"
#include "common/error.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "launcher/launch.h"

namespace dtrain::app {
namespace {

struct ResumeArgs {
  std::string ckpt;
  std::vector<std::string> sets;
  int node_rank = -1;
  std::string rdzv;
  std::vector<int> ranks;
  bool allow_large = false;
};

// The stored spec as a file load_job_spec can read (removed on scope exit).
class SpecFile {
 public:
  explicit SpecFile(const std::string& yaml) {
    // mkstemps: created O_EXCL under its final name, so no other file or link
    // by that name is ever written through.
    char tmpl[] = "/tmp/dtrain-resume-XXXXXX.yaml";
    int fd = ::mkstemps(tmpl, 5);
    if (fd < 0) throw Error(ErrorCode::internal, "cannot create a temporary spec file in /tmp");
    path_ = tmpl;
    bool ok = ::write(fd, yaml.data(), yaml.size()) == ssize_t(yaml.size());
    ::close(fd);
    if (!ok) ::unlink(tmpl);
    if (!ok) throw Error(ErrorCode::internal, "cannot write the temporary spec file " + path_);
  }
  ~SpecFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int run_resume(const ResumeArgs& args) {
  const std::string dir = checkpoint::resolve(args.ckpt);
  checkpoint::CheckpointReader reader(dir);  // index present, every rank file there
  const checkpoint::Index& x = reader.index();
  SpecFile spec_file(x.spec_yaml);
  // Checkpoints go on next to the one resumed from (the run may have moved);
  // the user's --set comes last and wins.
  std::vector<std::string> overrides = {
      "checkpoint.dir=" + std::filesystem::absolute(dir).parent_path().lexically_normal().string()};
  overrides.insert(overrides.end(), args.sets.begin(), args.sets.end());
  std::vector<std::string> warnings;
  JobSpec spec = load_job_spec(spec_file.path(), overrides, &warnings);
  for (const auto& w : warnings) DTRAIN_WARN("{}", w);
  spec.source = dir + "/index.json (spec)";
  DTRAIN_INFO("resuming {} from {}: step {} of {}, saved on mesh {}", spec.job.name, dir, x.step,
              spec.train.steps, x.mesh);
  if (x.step >= spec.train.steps)
    DTRAIN_WARN("the checkpoint is at step {} and train.steps = {}: nothing to train; "
                "use --set train.steps=<more>", x.step, spec.train.steps);

  check_node_and_ranks(spec, args.node_rank, args.ranks);
  launcher::LaunchOptions options;
  options.allow_large = args.allow_large;
  options.node_rank = args.node_rank;
  if (options.node_rank < 0 && spec.cluster.nodes_max == 1) options.node_rank = 0;
  options.rdzv = args.rdzv;
  options.console_ranks = args.ranks;
  // Workers load exactly this checkpoint on the first launch; an agent
  // restart after that loads `latest` (DTRAIN_RESTART > 0). Steps newer than
  // it are moved aside first (launcher/checkpoint_start.h).
  options.resume_from = std::filesystem::absolute(dir).string();
  return launcher::launch(spec, options);
}

void add_resume(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ResumeArgs>();
  auto* cmd = app.add_subcommand("resume", "continue a run from its checkpoint (spec from the checkpoint)");
  cmd->add_option("--ckpt", args->ckpt, "a run's checkpoint.dir (uses latest) or one step_<N>")->required();
  cmd->add_option("--set", args->sets, "override a stored spec field: key.path=value (YAML value)");
  cmd->add_option("--node-rank", args->node_rank, "this machine's node rank (node 0 hosts the rendezvous)")
      ->check(CLI::Range(0, kMaxNodes - 1));
  cmd->add_flag("--allow-large", args->allow_large,
                "start even when the training state looks larger than this machine's memory");
  cmd->add_option("--rdzv", args->rdzv, "HOST:PORT of the rendezvous");
  cmd->add_option("--ranks", args->ranks, "ranks whose output reaches the console")->delimiter(',');
  cmd->callback([args, &exit_code] { exit_code = run_resume(*args); });
}

}  // namespace

DTRAIN_REGISTER_COMMAND(35, add_resume);

}  // namespace dtrain::app
