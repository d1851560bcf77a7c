// Unit tests: the root-cause block and error files (launcher/root_cause.h,
// common/error_file.h), which failure is the job's (launcher/failure_origin.h),
// and log tails (launcher/rank_output.h).
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "common/error_file.h"
#include "launcher/failure_origin.h"
#include "launcher/rank_output.h"
#include "launcher/root_cause.h"

using namespace dtrain::launcher;

TEST_CASE("error_file_message: torchelastic JSON, plain JSON, text") {
  CHECK(error_file_message(R"({"message": {"message": "RuntimeError: x", "extraInfo": {}}})") ==
        "RuntimeError: x");
  CHECK(error_file_message(R"({"message": "boom"})") == "boom");
  CHECK(error_file_message("not json at all") == "not json at all");
  CHECK(error_file_message(std::string(5000, 'a')).size() < 2100);
}

TEST_CASE("RankOutput: log gets raw bytes, tail_lines the last lines") {
  char tmpl[] = "/tmp/dtrain-unit-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::string log = dir + "/rank_3.log";
  {
    RankOutput out(3, log, /*console=*/false, /*header=*/"");
    for (int i = 0; i < 25; ++i) {
      std::string line = "line " + std::to_string(i) + "\n";
      out.write(line.data(), line.size());
    }
    out.write("partial", 7);
  }
  auto tail = tail_lines(log, 10);
  REQUIRE(tail.size() == 10);
  CHECK(tail.front() == "line 16");
  CHECK(tail.back() == "partial");
  {
    RankOutput again(3, log, false, "===== restart 1 =====");  // a restart appends
    again.write("more\n", 5);
  }
  CHECK(tail_lines(log, 1).back() == "more");
  auto last3 = tail_lines(log, 3);
  CHECK(last3[0] == "partial");  // ended on a fresh line before the separator
  CHECK(last3[1] == "===== restart 1 =====");

  RootCause cause;
  cause.host = "h1";
  cause.node_id = "h1:42";
  cause.node_rank = 1;
  cause.restarts_used = 2;
  cause.max_restarts = 2;
  cause.worker.rank = 5;
  cause.worker.local_rank = 1;
  cause.worker.exit.signal = SIGSEGV;
  cause.worker.spec.log_path = log;
  cause.worker.spec.error_file = dir + "/error_rank_5.json";
  cause.worker.error_file_text = R"({"message": "segfault in kernel"})";
  std::string text = cause.to_text();
  CHECK(text.find("host       : h1") != std::string::npos);
  CHECK(text.find("node       : 1 (h1:42)") != std::string::npos);
  CHECK(text.find("rank       : 5 (local rank 1)") != std::string::npos);
  CHECK(text.find("signal 11 (SIGSEGV)") != std::string::npos);
  CHECK(text.find("restarts   : 2 of 2 used") != std::string::npos);
  CHECK(text.find("segfault in kernel") != std::string::npos);
  CHECK(text.find("    | more") != std::string::npos);
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST_CASE("error files from dtrain-worker: the step in the block and in the report; which failure is ours") {
  dtrain::ErrorFileRecord r;
  r.message = "fault.kind = raise: boom";
  r.rank = 3;
  r.step = 7;
  r.time_ms = 1700000000000;
  const std::string json = dtrain::error_file_json(r);
  CHECK(error_file_message(json) == "fault.kind = raise: boom");
  CHECK(error_file_report(json) == "in step 7: fault.kind = raise: boom");
  CHECK(error_file_report(R"({"message": "no step"})") == "no step");

  RootCause cause;
  cause.worker.rank = 3;
  cause.worker.spec.log_path = "/nonexistent/rank_3.log";
  cause.worker.spec.error_file = "/r/error_rank_3.json";
  cause.worker.error_file_text = json;
  const std::string text = cause.to_text();
  CHECK(text.find("step       : 7 (the step it failed in)") != std::string::npos);
  CHECK(text.find("    fault.kind = raise: boom") != std::string::npos);
  cause.worker.error_file_text = R"({"message": "no step"})";
  CHECK(cause.to_text().find("step       :") == std::string::npos);

  const std::string failure =
      "rank 3 (local rank 1) on node 1 (10.0.0.2, hostname vm, id '10.0.0.2:77') failed: exit code 1";
  CHECK(failure_is_ours(failure, "10.0.0.2:77", 3));
  CHECK_FALSE(failure_is_ours(failure, "10.0.0.2:78", 3));  // another agent
  CHECK_FALSE(failure_is_ours(failure, "10.0.0.2:77", 1));  // another rank of ours
  CHECK_FALSE(failure_is_ours("node '10.0.0.2:77' missed 3 heartbeats", "10.0.0.2:77", 3));
  CHECK_FALSE(failure_is_ours("rank 3 (local rank 1) on node 0 (10.0.0.1, id 'a:1') failed\n"
                              "  lost node 1: id '10.0.0.2:77'",
                              "10.0.0.2:77", 3));  // only the first line names the node
}
