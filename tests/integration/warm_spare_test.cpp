// Warm spares through the real `dtrain launch` (tiny GPT of the parity
// fixture, one worker): a worker killed after step 3 is restarted in the
// spare the agent started with the round (the agent names its pid, and that
// process says it was a spare given rank 0), the job finishes, and no spare
// outlives dtrain.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing;
using parity::Parity;

struct Launched {
  int code = -1;
  std::string out;
  std::vector<pid_t> left;  // processes of the job still alive after dtrain exited
};

Launched launch(const std::string& name, std::vector<std::string> sets) {
  auto& p = Parity::get();
  TagGuard tag;
  const std::string run_dir = p.dir / name;
  sets.insert(sets.begin(), {"log.dir=" + run_dir, "checkpoint.dir=" + run_dir + "/ckpt", "train.steps=6",
                             "checkpoint.every=2", "cluster.max_restarts=1", "fault.kind=kill_after_step",
                             "fault.step=3", "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())});
  std::vector<std::string> argv = {dtrain_bin(), "launch", p.dir / "spec.yaml"};
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  Launched l;
  std::tie(l.code, l.out) = run_command(argv, p.dir / (name + ".log"), 300, {tag.env(), "DTRAIN_NO_REBUILD=1"});
  l.left = tagged_pids(tag.tag());
  return l;
}

int last_step(const std::string& run) {
  const auto losses = parity::losses_by_step(Parity::get().dir / run + "/metrics.jsonl");
  return losses.empty() ? 0 : losses.rbegin()->first;
}

}  // namespace

TEST_CASE("a restart runs the killed rank in the warm spare started with the round; none outlives dtrain") {
  Launched l = launch("spare", {});
  INFO(l.out);
  REQUIRE(l.code == 0);
  CHECK(l.out.find("restarting the workers: restart 1 of 1") != std::string::npos);
  const std::string said = "rank 0 starts in warm spare pid ";
  const size_t at = l.out.find(said);
  REQUIRE_MESSAGE(at != std::string::npos, "the agent did not start the restart in a warm spare");
  const long pid = std::stol(l.out.substr(at + said.size()));
  MESSAGE("restart 1: rank 0 ran in warm spare pid " << pid);
  // The process itself: started as a spare (it read its rank from the pipe).
  const std::string worker_said = "dtrain-worker: warm spare pid " + std::to_string(pid) + " given rank 0";
  CHECK(read_file(Parity::get().dir / "spare/rank_0.log").find(worker_said) != std::string::npos);
  CHECK(last_step("spare") == 6);
  CHECK_MESSAGE(l.left.empty(), l.left.size() << " process(es) of the job outlived dtrain (an idle spare?)");
}

TEST_CASE("cluster.warm_spares: false starts the restart as a new process and keeps no spare") {
  Launched l = launch("no_spare", {"cluster.warm_spares=false"});
  INFO(l.out);
  REQUIRE(l.code == 0);
  CHECK(l.out.find("restarting the workers: restart 1 of 1") != std::string::npos);
  CHECK(l.out.find("starts in warm spare pid") == std::string::npos);
  CHECK(read_file(Parity::get().dir / "no_spare/rank_0.log").find("dtrain-worker: warm spare pid") ==
        std::string::npos);
  CHECK(last_step("no_spare") == 6);
  CHECK_MESSAGE(l.left.empty(), l.left.size() << " process(es) of the job outlived dtrain");
}
