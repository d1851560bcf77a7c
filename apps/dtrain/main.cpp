// dtrain: the CLI entry point. Wires the registered subcommands (cmd_*.cpp)
// into CLI11, catches dtrain::Error and maps it to an exit code. The only
// place in the project that exits.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "apps/dtrain/command.h"
#include "common/error.h"
#include "common/log.h"
#include "launcher/worker_watch.h"

namespace dtrain::app {
std::vector<CommandEntry>& command_registry() {
  static std::vector<CommandEntry> registry;
  return registry;
}

}  // namespace dtrain::app

int main(int argc, char** argv) {
  dtrain::log::init("dtrain");
  // The agent's worker watch (launcher/worker_watch.h): not a user command.
  if (argc == 4 && std::strcmp(argv[1], dtrain::launcher::kWatchWorkersCommand) == 0)
    return dtrain::launcher::run_worker_watch(0, std::atof(argv[2]), std::atoi(argv[3]));
  CLI::App app{"dtrain: launcher, orchestrator and training engine for distributed deep learning"};
  app.require_subcommand(1);
  int exit_code = 0;
  auto& registry = dtrain::app::command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const auto& a, const auto& b) { return a.order < b.order; });
  for (auto& entry : registry) entry.add(app, exit_code);
  try {
    dtrain::app::check_subcommands(app, argc, argv);  // names a typo, before CLI11 does
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const dtrain::Error& e) {
    std::cerr << "dtrain: error: " << e.message() << "\n";
    if (!e.hint().empty()) std::cerr << "  fix: " << e.hint() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "dtrain: internal error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}
