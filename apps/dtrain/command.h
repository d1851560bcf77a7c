// Subcommand registry of the dtrain CLI. Each cmd_<name>.cpp registers one
// subcommand with DTRAIN_REGISTER_COMMAND; main.cpp wires them into CLI11.
// Commands throw dtrain::Error for user-facing failures; only main() exits.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace dtrain::app {

// Adds a subcommand to `app`. The subcommand's callback stores its exit
// code in `exit_code` (0 unless the command says otherwise).
using CommandAdder = std::function<void(CLI::App& app, int& exit_code)>;

struct CommandEntry {
  int order;  // position in --help
  CommandAdder add;
};

std::vector<CommandEntry>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(int order, CommandAdder add) {
    command_registry().push_back({order, std::move(add)});
  }
};

}  // namespace dtrain::app

#define DTRAIN_CONCAT_INNER(a, b) a##b
#define DTRAIN_CONCAT(a, b) DTRAIN_CONCAT_INNER(a, b)
#define DTRAIN_REGISTER_COMMAND(order, fn) \
  static ::dtrain::app::CommandRegistrar DTRAIN_CONCAT(dtrain_cmd_, __LINE__)(order, fn)
