// `dtrain trace merge LOG_DIR OUT.json`: the per-rank timeline files a run
// traced with log.trace.steps wrote into LOG_DIR/trace as one Chrome-trace
// JSON (ui.perfetto.dev, chrome://tracing). Never writes over an existing file
// unless --force, nor through a link (common/safe_output). The format and the
// merge are common/timeline.
#include <iostream>
#include <memory>

#include "apps/dtrain/command.h"
#include "common/safe_output.h"
#include "common/timeline.h"

namespace dtrain::app {
namespace {

int run_trace_merge(const std::string& log_dir, const std::string& out, bool force) {
  // The target is checked before the rank files are read.
  SafeOutput target(out, "OUT", force ? Clobber::replace : Clobber::refuse);
  RemoveTmpOnSignal cleanup(target);
  timeline::MergeStats stats;
  target.write(timeline::merge_to_chrome(log_dir, &stats));
  target.commit();
  std::cout << "merged the timelines of " << stats.ranks << " rank(s) (" << stats.spans << " spans) from " << log_dir
            << "/trace into " << out << "; open it in ui.perfetto.dev or chrome://tracing\n";
  if (stats.dropped > 0)
    std::cerr << "warning: " << stats.dropped << " spans did not fit the ranks' trace buffers and are missing\n";
  return 0;
}

void add_trace(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("trace", "work with timeline traces (log.trace.steps)");
  cmd->require_subcommand(1);
  struct MergeArgs {
    std::string dir, out;
    bool force = false;
  };
  auto ma = std::make_shared<MergeArgs>();
  auto* merge = cmd->add_subcommand("merge", "write one Chrome-trace JSON of every rank's timeline");
  merge->add_option("log_dir", ma->dir, "the traced run's log.dir (its trace/rank_<r>.json)")->required();
  merge->add_option("out", ma->out, "output .json file (a new file)")->required();
  merge->add_flag("--force", ma->force, "replace OUT when it is an existing file");
  merge->callback([ma, &exit_code] { exit_code = run_trace_merge(ma->dir, ma->out, ma->force); });
}

}  // namespace

DTRAIN_REGISTER_COMMAND(75, add_trace);

}  // namespace dtrain::app
