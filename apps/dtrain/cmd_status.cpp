// `dtrain status [--rdzv HOST:PORT | LOG_DIR] [--watch S] [--format json]`:
// a running job's nodes and ranks (state, step, tokens/s, loss, last
// collective, straggler ratio), round and restarts, as its rendezvous knows
// them. Only CLI wiring: the query and its renderings are launcher/job_status.h.
#include <stdlib.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <thread>

#include "apps/dtrain/command.h"
#include "common/error.h"
#include "launcher/job_status.h"

namespace dtrain::app {
namespace {

struct StatusOptions {
  std::string log_dir;
  std::string rdzv;
  double watch_s = 0;  // 0 = once
  std::string format = "text";
};

void run_status(const StatusOptions& o) {
  if (o.rdzv.empty() == o.log_dir.empty())
    throw Error(ErrorCode::config, "dtrain status: give either a job's LOG_DIR or --rdzv HOST:PORT (not both)");
  const launcher::StatusTarget target = launcher::find_status_target(o.rdzv, o.log_dir);
  // gRPC's own log lines (a refused TLS handshake) would come before ours:
  // the one line this command prints on a failure says it all.
  ::setenv("GRPC_VERBOSITY", "NONE", /*overwrite=*/0);
  for (;;) {
    // A job that ends while watched ends the watch with its one line.
    const rendezvous::ServerStatus s = launcher::query_status(target);
    const std::string text = o.format == "json" ? launcher::status_json(s, target.endpoint)
                                                : launcher::status_text(s, target.endpoint);
    if (o.watch_s <= 0) {
      std::cout << text << std::flush;
      return;
    }
    std::cout << "\033[H\033[2J" << text << std::flush;  // like top: redraw in place
    std::this_thread::sleep_for(std::chrono::duration<double>(o.watch_s));
  }
}

void add_status(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<StatusOptions>();
  CLI::App* cmd = app.add_subcommand(
      "status", "Show a running job's nodes and ranks: state, step, tokens/s, loss, last collective, "
                "straggler ratio, restarts, round");
  cmd->add_option("log_dir", opts->log_dir, "The job's log.dir (its lock file names the rendezvous)");
  cmd->add_option("--rdzv", opts->rdzv, "The job's rendezvous HOST:PORT (token from DTRAIN_TOKEN)");
  cmd->add_option("--watch", opts->watch_s, "Refresh every S seconds until the job ends")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--format", opts->format, "Output format")->check(CLI::IsMember({"text", "json"}));
  cmd->callback([opts, &exit_code] {
    run_status(*opts);
    exit_code = 0;
  });
}

}  // namespace
}  // namespace dtrain::app

DTRAIN_REGISTER_COMMAND(38, dtrain::app::add_status);
