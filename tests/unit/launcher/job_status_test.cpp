// `dtrain status`'s pieces without a job: where it finds a job (the lock
// file's endpoint, the 0600 token file) and what a log.dir without a running
// job says (one line); the JSON it prints for a known status.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <stdlib.h>

#include "common/error.h"
#include "launcher/job_status.h"
#include "launcher/run_dir_lock.h"
#include "tests/support/child.h"

using namespace dtrain::launcher;
using dtrain::testing::TempDir;
using dtrain::testing::write_file;

TEST_CASE("dtrain status: the endpoint from the lock file, the token from the job's token file") {
  ::unsetenv("DTRAIN_TOKEN");
  TempDir dir;
  LockOwner me = this_agent("j", "id", "h");
  {
    RunDirLock lock(dir.path(), "log.dir", me);
    // Before the endpoint is recorded (and after the job ends): one line, no job.
    try {
      find_status_target("", dir.path());
      FAIL("no error without an endpoint");
    } catch (const dtrain::Error& e) {
      MESSAGE(e.message());
      CHECK(e.message().find("no running job") != std::string::npos);
      CHECK(e.message().find('\n') == std::string::npos);
      CHECK(e.hint().empty());
    }
    lock.record_endpoint("127.0.0.1:4321");
    write_file(dir / kTokenFile, "the-token\n");
    StatusTarget t = find_status_target("", dir.path());
    CHECK(t.endpoint == "127.0.0.1:4321");
    CHECK(t.token == "the-token");
  }
  // The lock released: its text is gone, so is the job.
  CHECK_THROWS_WITH_AS(find_status_target("", dir.path()), doctest::Contains("no running job"), dtrain::Error);
}

TEST_CASE("dtrain status --format json: nodes with their ranks' step, loss, tokens/s") {
  dtrain::rendezvous::ServerStatus s;
  s.job = "j";
  s.round = 3;
  s.restart = 1;
  s.round_open = false;
  dtrain::rendezvous::NodeStatus n;
  n.node_id = "10.0.0.1:77";
  n.host = "10.0.0.1";
  n.hostname = "a";
  n.node_rank = 0;
  dtrain::trace::RankProgress p;
  p.rank = 1;
  p.done_step = 42;
  p.phase = "forward";
  p.last_step_ns = 500'000'000;
  p.tokens_per_step = 1000;
  p.has_loss = true;
  p.loss = 2.5;
  n.ranks.push_back(p);
  s.nodes.push_back(n);
  auto j = nlohmann::json::parse(status_json(s, "h:1"));
  CHECK(j["round"] == 3);
  CHECK(j["restarts"] == 1);
  REQUIRE(j["nodes"].size() == 1);
  CHECK(j["nodes"][0]["id"] == "10.0.0.1:77");
  CHECK(j["nodes"][0]["address"] == "10.0.0.1");
  CHECK(j["nodes"][0]["hostname"] == "a");
  REQUIRE(j["nodes"][0]["ranks"].size() == 1);
  const auto& r = j["nodes"][0]["ranks"][0];
  CHECK(r["rank"] == 1);
  CHECK(r["step"] == 42);
  CHECK(r["loss"] == 2.5);
  CHECK(r["state"] == "forward");
  CHECK(r["tokens_per_s"].get<double>() == doctest::Approx(2000.0));
}
