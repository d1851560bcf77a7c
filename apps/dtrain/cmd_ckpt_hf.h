// The Hugging Face subcommands of `dtrain ckpt` (cmd_ckpt_hf.cpp).
#pragma once

#include <CLI/CLI.hpp>

namespace dtrain::app {

// Adds import-hf and export-hf under `ckpt`.
void add_ckpt_hf(CLI::App& ckpt, int& exit_code);

}  // namespace dtrain::app
