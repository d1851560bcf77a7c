// `dtrain data prepare --tokenizer TOKENIZER_JSON --input FILE... --output
// PREFIX [--text-key text] [--append-eod] [--force]`: checks its arguments
// (tokenizer and inputs readable, PREFIX.bin/.idx/.json refused when they
// exist unless --force, as `ckpt merge` refuses), then runs
// scripts/data_prepare.py with the project venv's Python, which tokenizes.
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "apps/dtrain/command.h"
#include "common/error.h"
#include "common/safe_output.h"

#ifndef DTRAIN_SOURCE_DIR
#error "DTRAIN_SOURCE_DIR must name the source tree (apps/dtrain/CMakeLists.txt)"
#endif
#ifndef DTRAIN_DEFAULT_PYTHON
#define DTRAIN_DEFAULT_PYTHON ""
#endif

extern char** environ;

namespace dtrain::app {
namespace {

struct PrepareArgs {
  std::string tokenizer, output, text_key = "text";
  std::vector<std::string> inputs;
  bool append_eod = false, force = false;
};

void readable_file(const std::string& path, const std::string& option, const std::string& hint) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(ErrorCode::config, option + " " + path + ": " + std::strerror(errno), hint);
  if (!S_ISREG(st.st_mode)) throw Error(ErrorCode::config, option + " " + path + " is not a regular file", hint);
  if (::access(path.c_str(), R_OK) != 0)
    throw Error(ErrorCode::config, option + " " + path + ": " + std::strerror(errno), hint);
}

// The venv's Python: $DTRAIN_VENV/bin/python, else the one the build found.
std::string venv_python() {
  const char* venv = std::getenv("DTRAIN_VENV");
  const std::string python = venv && *venv ? std::string(venv) + "/bin/python" : std::string(DTRAIN_DEFAULT_PYTHON);
  if (python.empty() || ::access(python.c_str(), X_OK) != 0)
    throw Error(ErrorCode::config, "data prepare: no Python at '" + python + "' (DTRAIN_VENV" +
                                       (venv && *venv ? " = " + std::string(venv) : " unset") + ")",
                "run scripts/install-deps and export DTRAIN_VENV=$(scripts/install-deps)");
  return python;
}

pid_t g_child = -1;
extern "C" void forward_signal(int sig) {
  if (g_child > 0) ::kill(g_child, sig);  // the script removes its temporaries and ends
}

// Runs argv, forwarding SIGINT/SIGTERM/SIGHUP to it; its exit code (128 + signal when killed).
int run_child(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // posix_spawn, not fork: the CLI links gRPC, whose threads a fork would copy half-way.
  pid_t pid = -1;
  if (const int rc = ::posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ); rc != 0)
    throw Error(ErrorCode::config, "data prepare: cannot run " + argv[0] + ": " + std::strerror(rc),
                "check DTRAIN_VENV (run scripts/install-deps)");
  g_child = pid;
  struct sigaction sa {}, old[3];
  sa.sa_handler = forward_signal;
  const int sigs[3] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; ++i) ::sigaction(sigs[i], &sa, &old[i]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  for (int i = 0; i < 3; ++i) ::sigaction(sigs[i], &old[i], nullptr);
  g_child = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int run_prepare(const PrepareArgs& a) {
  readable_file(a.tokenizer, "--tokenizer", "give a tokenizers JSON file (a Hugging Face tokenizer.json)");
  for (const auto& in : a.inputs)
    readable_file(in, "--input", "give JSONL files (one document per line) or text files (one document each)");
  const std::string dir = std::filesystem::path(a.output).parent_path().string();
  if (!dir.empty() && !std::filesystem::is_directory(dir))
    throw Error(ErrorCode::config, "--output " + a.output + ": the directory " + dir + " does not exist",
                "create it first, or give a PREFIX in an existing directory");
  // The same refusals as every file dtrain writes (a link, a directory, an
  // existing file without --force); the probe's temporary goes at once.
  for (const char* ext : {".bin", ".idx", ".json"})
    SafeOutput probe(a.output + ext, "--output", a.force ? Clobber::replace : Clobber::refuse);
  const std::string python = venv_python(), script = std::string(DTRAIN_SOURCE_DIR) + "/scripts/data_prepare.py";
  std::vector<std::string> argv = {python, script, "--tokenizer", a.tokenizer, "--output", a.output,
                                   "--text-key", a.text_key};
  if (a.append_eod) argv.push_back("--append-eod");
  if (a.force) argv.push_back("--force");
  argv.push_back("--");
  argv.insert(argv.end(), a.inputs.begin(), a.inputs.end());
  std::cerr << "dtrain data prepare: running " << python << " " << script << "\n";
  return run_child(argv);
}

void add_data(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("data", "prepare training data");
  cmd->require_subcommand(1);
  auto a = std::make_shared<PrepareArgs>();
  auto* prep = cmd->add_subcommand(
      "prepare", "tokenize JSONL or text files into a Megatron indexed dataset PREFIX.bin/.idx (+ PREFIX.json)");
  prep->add_option("--tokenizer", a->tokenizer, "tokenizers JSON file (Hugging Face tokenizer.json)")->required();
  prep->add_option("--input", a->inputs, "JSONL (one document per line) or text files (one document each)")
      ->required()
      ->expected(1, -1);
  prep->add_option("--output", a->output, "output PREFIX: writes PREFIX.bin, PREFIX.idx, PREFIX.json")->required();
  prep->add_option("--text-key", a->text_key, "the JSONL field holding a document's text");
  prep->add_flag("--append-eod", a->append_eod, "end every document with the tokenizer's end-of-document id");
  prep->add_flag("--force", a->force, "replace PREFIX.* when they exist");
  prep->callback([a, &exit_code] { exit_code = run_prepare(*a); });
}

}  // namespace

DTRAIN_REGISTER_COMMAND(75, add_data);

}  // namespace dtrain::app
