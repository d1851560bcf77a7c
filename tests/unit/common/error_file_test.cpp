// Unit tests: the worker's error file (common/error_file.h): what it holds,
// what torchelastic's reader and ours make of it, and its atomic write.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error_file.h"

TEST_CASE("error file: torchelastic's layout round-trips message, rank, step and time") {
  dtrain::ErrorFileRecord r;
  r.message = "RuntimeError: \"quoted\"\nsecond line";
  r.rank = 2;
  r.step = 5;
  r.time_ms = 1700000123456;
  const std::string text = dtrain::error_file_json(r);
  // torch.distributed.elastic reads message.message and an int-like extraInfo.timestamp.
  auto j = nlohmann::json::parse(text);
  CHECK(j["message"]["message"] == r.message);
  CHECK(j["message"]["extraInfo"]["timestamp"] == "1700000123");
  const auto back = dtrain::parse_error_file(text);
  CHECK(back.message == r.message);
  CHECK(back.rank == 2);
  CHECK(back.step == 5);
  CHECK(back.time_ms == 1700000123456);
  CHECK(back.error_code.empty());  // not given: a crash, which the agent may restart
  r.error_code = "config";        // a dtrain::Error(config): the agent does not restart it
  CHECK(dtrain::parse_error_file(dtrain::error_file_json(r)).error_code == "config");
  // torchelastic's own files give whole seconds only.
  CHECK(dtrain::parse_error_file(R"({"message": {"message": "m", "extraInfo": {"timestamp": "17"}}})")
            .time_ms == 17000);

  const auto plain = dtrain::parse_error_file(R"({"message": "boom"})");
  CHECK(plain.message == "boom");
  CHECK(plain.step == -1);
  const auto garbage = dtrain::parse_error_file("Segmentation fault");
  CHECK(garbage.message == "Segmentation fault");
  CHECK(garbage.rank == -1);
  // Not UTF-8: replaced, the file still parses.
  r.message = std::string("bad \xff byte");
  CHECK(nlohmann::json::accept(dtrain::error_file_json(r)));
}

TEST_CASE("error file: written whole (replacing an old one), nothing left beside it") {
  char tmpl[] = "/tmp/dtrain-unit-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/error_rank_0.json";
  { std::ofstream(path) << "stale"; }
  dtrain::ErrorFileRecord r;
  r.message = "x";
  r.step = 1;
  REQUIRE(dtrain::write_error_file(path, r));
  std::stringstream ss;
  ss << std::ifstream(path).rdbuf();
  CHECK(dtrain::parse_error_file(ss.str()).step == 1);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  CHECK(files == 1);
  CHECK_FALSE(dtrain::write_error_file(dir + "/missing/dir/e.json", r));
  CHECK_FALSE(dtrain::write_error_file("", r));
  std::filesystem::remove_all(dir);
}
