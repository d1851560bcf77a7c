// Subcommand registry of the dtrain CLI. Each cmd_<name>.cpp registers one
// subcommand with DTRAIN_REGISTER_COMMAND; main.cpp wires them into CLI11.
// Commands throw dtrain::Error for user-facing failures; only main() exits.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace dtrain::app {

// Adds a subcommand to `app`. The subcommand's callback stores its exit
// code in `exit_code` (0 unless the command says otherwise).
using CommandAdder = std::function<void(CLI::App& app, int& exit_code)>;

struct CommandEntry {
  int order;  // position in --help
  CommandAdder add;
};

std::vector<CommandEntry>& command_registry();

// Bounds of the CLI's integer options (--nodes, --node-rank).
constexpr int kMaxNodes = 65536;

// --node-rank below cluster.nodes and every --ranks entry below the world
// size, checked once the spec is known (-1 = not given). Throws
// dtrain::Error(config) naming the option, the value and the range.
void check_node_and_ranks(const JobSpec& spec, int node_rank, const std::vector<int>& ranks);

// Builds and simulates the pipeline plan of `spec` (as the engine will, before
// its first step); throws dtrain::Error(config) when the simulator rejects
// it, so no worker starts. Returns the printed plan.
std::string checked_pipeline_plan(const JobSpec& spec);

// The subcommand words of argv ("dtrain ckpt merge ...") against the CLI's
// tree: an unknown one throws dtrain::Error(config) naming it, the closest
// valid name and every valid one (CLI11 would only say a subcommand is required).
void check_subcommands(const CLI::App& app, int argc, char** argv);

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
