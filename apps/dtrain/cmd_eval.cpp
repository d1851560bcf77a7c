// `dtrain eval SPEC [--ckpt DIR] [--batches K] [--set k=v]... [--format
// text|json] [--logits-out FILE]`: the mean next-token cross-entropy and perplexity of a
// checkpoint over the first K windows of data.valid (or data.path), on the
// spec's mesh. CLI only: it checks the input, then launches the spec's
// workers in their eval mode (engine/trainer/evaluation.h) through
// launcher::launch and prints what rank 0 wrote.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/dtrain/command.h"
#include "common/checkpoint_dir.h"
#include "common/checkpoint_reader.h"
#include "common/error.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "launcher/launch.h"
#include "plan/combinations.h"

namespace dtrain::app {
namespace {

namespace fs = std::filesystem;

struct EvalArgs {
  std::string spec;
  std::vector<std::string> sets;
  std::string ckpt;
  int batches = 0;  // 0: not given (data.valid.batches)
  bool batches_given = false;
  std::string format = "text";
  std::vector<int> ranks;
  std::string logits_out;  // "" = none
};

// The model shape of the checkpoint's stored spec against this spec's:
// every field that decides a tensor's shape, named with both values.
void check_model_matches(const ModelSpec& want, const checkpoint::Index& x, const std::string& dir) {
  const ModelSpec have = parse_job_spec(x.spec_yaml, dir + "/index.json (spec)").model;
  std::vector<std::string> diffs;
  auto cmp = [&](const char* name, auto a, auto b) {
    if (a != b) diffs.push_back(fmt::format("model.{} = {} in the checkpoint, {} in the spec", name, a, b));
  };
  cmp("kind", have.kind, want.kind);
  cmp("vocab", have.vocab, want.vocab);
  cmp("layers", have.layers, want.layers);
  cmp("d_model", have.d_model, want.d_model);
  cmp("heads", have.heads, want.heads);
  cmp("seq_len", have.seq_len, want.seq_len);
  cmp("moe.experts", have.moe.experts, want.moe.experts);
  cmp("moe.every", have.moe.every, want.moe.every);
  cmp("moe.d_ff", have.moe.d_ff, want.moe.d_ff);
  cmp("kv_heads", have.kv_heads, want.kv_heads);
  cmp("ffn_hidden", have.ffn_hidden, want.ffn_hidden);
  cmp("tie_embeddings", have.tie_embeddings, want.tie_embeddings);
  if (diffs.empty()) return;
  std::string msg = "checkpoint " + dir + " holds another model shape than the spec:";
  for (const auto& d : diffs) msg += "\n  " + d;
  throw Error(ErrorCode::config, msg, "evaluate it with the spec it was trained with (--set model.X=...)");
}

// The step directory to evaluate; a missing or broken one is a config error
// (exit 2) naming what was given.
std::string checked_checkpoint(const EvalArgs& args, const JobSpec& spec) {
  const std::string given = args.ckpt.empty() ? spec.checkpoint.dir : args.ckpt;
  const std::string field = args.ckpt.empty() ? "checkpoint.dir" : "--ckpt";
  if (given.empty())
    throw Error(ErrorCode::config, "no checkpoint to evaluate: --ckpt is not given and checkpoint.dir is empty",
                "pass --ckpt DIR (a run's checkpoint.dir or one step_<N>)");
  try {
    const std::string dir = checkpoint::resolve(given);
    checkpoint::CheckpointReader reader(dir);
    reader.check_headers();
    check_model_matches(spec.model, reader.index(), dir);
    return fs::absolute(dir).string();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::config) throw;
    throw Error(ErrorCode::config, field + " = " + given + ": " + e.message(),
                e.hint().empty() ? "pass --ckpt a run's checkpoint.dir or one of its step_<N>" : e.hint());
  }
}

// While alive, whatever is written to stdout (the workers' relayed lines)
// goes to stderr: --format json keeps stdout for the one JSON object.
class StdoutToStderr {
 public:
  explicit StdoutToStderr(bool on) : saved_(on ? ::dup(STDOUT_FILENO) : -1) {
    std::fflush(stdout);
    if (saved_ >= 0) ::dup2(STDERR_FILENO, STDOUT_FILENO);
  }
  ~StdoutToStderr() {
    if (saved_ < 0) return;
    std::fflush(stdout);
    ::dup2(saved_, STDOUT_FILENO);
    ::close(saved_);
  }
  StdoutToStderr(const StdoutToStderr&) = delete;
  StdoutToStderr& operator=(const StdoutToStderr&) = delete;

 private:
  int saved_;
};

int run_eval(const EvalArgs& args) {
  if (args.format != "text" && args.format != "json")
    throw Error(ErrorCode::config, "--format = " + args.format + ": must be text or json", "use --format json");
  std::vector<std::string> warnings;
  JobSpec spec = load_job_spec(args.spec, args.sets, &warnings);
  for (const auto& w : warnings) DTRAIN_WARN("{}", w);
  if (args.batches_given && args.batches < 1)
    throw Error(ErrorCode::config, "--batches = " + std::to_string(args.batches) + ": must be >= 1 (windows of " +
                                       "model.seq_len tokens to evaluate)", "e.g. --batches 16");
  const int windows = args.batches_given ? args.batches : spec.data.valid.batches;
  if (!args.logits_out.empty() && spec.world() != 1)
    throw Error(ErrorCode::config,
                fmt::format("--logits-out needs a one-rank mesh; parallel.dp ({}) x tp ({}) x pp ({}) x cp ({}) = {}",
                            spec.parallel.dp, spec.parallel.tp, spec.parallel.pp, spec.parallel.cp, spec.world()),
                "add --set parallel.dp=1 --set cluster.procs_per_node=1 (and tp, pp, cp 1)");
  const std::string dir = checked_checkpoint(args, spec);
  check_node_and_ranks(spec, -1, args.ranks);
  plan::check_combinations(spec);
  if (spec.parallel.pp > 1 && spec.builtin_entrypoint()) checked_pipeline_plan(spec);

  // The workers' run: no checkpoint.dir (nothing is saved, nothing moved
  // aside), their logs and the result in <log.dir>/eval, no restarts.
  JobSpec run = spec;
  run.checkpoint.dir.clear();
  run.log.dir = (fs::path(spec.log.dir) / "eval").string();
  run.log.tensorboard = false;
  run.cluster.max_restarts = 0;
  const std::string out = (fs::absolute(run.log.dir) / "eval.json").string();
  std::error_code ec;
  fs::remove(out, ec);  // a result is only ever this run's
  launcher::LaunchOptions options;
  if (run.cluster.nodes_max == 1) options.node_rank = 0;
  options.console_ranks = args.ranks;
  options.extra_env = {"DTRAIN_EVAL_CKPT=" + dir, "DTRAIN_EVAL_BATCHES=" + std::to_string(windows),
                       "DTRAIN_EVAL_OUT=" + out};
  if (!args.logits_out.empty())
    options.extra_env.push_back("DTRAIN_EVAL_LOGITS=" + fs::absolute(args.logits_out).string());
  int code = 0;
  {
    StdoutToStderr quiet(args.format == "json");
    code = launcher::launch(run, options);
  }
  if (code != 0) return code;
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw Error(ErrorCode::internal, "the eval workers exited 0 without writing " + out);
  const auto j = nlohmann::json::parse(text.str());
  if (args.format == "json") {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << fmt::format("eval {} (step {}): loss {:.6f}, ppl {:.4f} over {} tokens ({} windows)\n", dir,
                             j["step"].get<long long>(), j["loss"].get<double>(), j["ppl"].get<double>(),
                             j["tokens"].get<long long>(), windows);
    if (j.contains("loss_by_source"))  // data.valid.blend: each file's windows
      for (const auto& [name, loss] : j["loss_by_source"].items())
        std::cout << fmt::format("  {}: loss {:.6f}\n", name, loss.get<double>());
  }
  return 0;
}

void add_eval(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<EvalArgs>();
  auto* cmd = app.add_subcommand("eval", "loss and perplexity of a checkpoint on validation data, on the spec's mesh");
  cmd->add_option("spec", args->spec, "job spec (YAML)")->required();
  cmd->add_option("--ckpt", args->ckpt, "a run's checkpoint.dir (uses latest) or one step_<N> (default: the "
                                        "spec's checkpoint.dir)");
  cmd->add_option("--batches", args->batches, "windows of model.seq_len tokens to evaluate, the first ones in order "
                                              "(default: data.valid.batches)");
  cmd->add_option("--set", args->sets, "override a spec field: key.path=value (YAML value)");
  cmd->add_option("--format", args->format, "text (one line) or json (one object on stdout, logs on stderr)");
  cmd->add_option("--logits-out", args->logits_out, "also write the first window's logits [T, V] as float32 .npy "
                                                    "(one-rank meshes)");
  cmd->add_option("--ranks", args->ranks, "ranks whose output reaches the console")->delimiter(',');
  cmd->callback([args, &exit_code, cmd] {
    args->batches_given = cmd->count("--batches") > 0;
    exit_code = run_eval(*args);
  });
}

}  // namespace

DTRAIN_REGISTER_COMMAND(36, add_eval);

}  // namespace dtrain::app
