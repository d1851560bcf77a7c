// Checkpoint files as untrusted input, crafted here: index file names that
// leave the step directory, shapes whose element or byte count overflows,
// shards that overlap or leave a gap (named: tensor, shards, region), a
// FIFO or a link where a regular file belongs (refused without blocking), a
// `latest` that points outside its directory, and pruning that never
// reaches a moved-aside previous_<time>/.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_index.h"
#include "common/checkpoint_reader.h"
#include "common/checkpoint_writer.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "tests/support/child.h"

namespace fs = std::filesystem;
using namespace dtrain::checkpoint;
namespace st = dtrain::safetensors;
using Json = nlohmann::ordered_json;

namespace {

using Tmp = dtrain::testing::TempDir;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dtrain::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not a dtrain::Error) ") + e.what();
  }
  return "(no error)";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// An index of one F32 tensor "model/w" of `shape` with the given shards
// (file, slice), as JSON text: what a crafted index.json holds.
std::string index_json(const Json& shape, const std::vector<std::pair<std::string, Json>>& shards,
                       const std::vector<std::string>& files = {"rank_0.safetensors", "rank_1.safetensors"}) {
  Json sh = Json::array();
  int k = 0;
  for (const auto& [file, slice] : shards)
    sh.push_back({{"file", file}, {"key", "k" + std::to_string(k++)}, {"slice", slice}, {"crc32c", "00000000"}});
  Json j = {{"format", "dtrain-checkpoint"}, {"version", 1}, {"step", 1}, {"mesh", "dp=1"}, {"world", 1},
            {"model", "toy"}, {"sampler", {{"consumed", 0}}}, {"optimizer", {{"step_count", 1}}},
            {"schedule", {{"lr", 0.1}, {"min_lr", 0.0}, {"warmup_steps", 0}, {"total_steps", 1}}},
            {"files", files},
            {"tensors", {{{"name", "model/w"}, {"dtype", "F32"}, {"shape", shape}, {"shards", sh}}}},
            {"spec", ""}};
  return j.dump();
}

std::string index_error(const std::string& text) {
  return error_of([&] { index_from_json(text, "idx.json"); });
}

void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[size_t(i)] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << len << header << data;
}

}  // namespace

TEST_CASE("index: every file name is a plain name inside the step directory") {
  for (const std::string bad : {"../x.safetensors", "../../etc/passwd", "/etc/passwd", "a/b.safetensors", "..", ".", ""}) {
    CAPTURE(bad);
    const std::string msg = index_error(index_json({2}, {{bad, {{0, 2}}}}, {bad}));
    CHECK(has(msg, "idx.json: file \"" + bad + "\" is not a plain file name"));
  }
  // A shard naming a file the index does not list.
  const std::string msg = index_error(index_json({2}, {{"rank_9.safetensors", {{0, 2}}}}));
  CHECK(has(msg, "tensor model/w: shard file \"rank_9.safetensors\" is not one of the index's \"files\""));
}

TEST_CASE("index: shapes whose element or byte count overflows, negative dims, unknown dtypes") {
  const Json big = {(1LL << 62) + 1, 4};
  CHECK(has(index_error(index_json(big, {{"rank_0.safetensors", {{0, (1LL << 62) + 1}, {0, 4}}}})),
            "tensor model/w is \"F32\" [4611686018427387905, 4]: not a valid tensor"));
  const Json square = {1LL << 32, 1LL << 32};
  CHECK(has(index_error(index_json(square, {{"rank_0.safetensors", {{0, 1LL << 32}, {0, 1LL << 32}}}})),
            "[4294967296, 4294967296]: not a valid tensor"));
  CHECK(has(index_error(index_json({-2, 4}, {{"rank_0.safetensors", {{0, 0}, {0, 4}}}})), "[-2, 4]: not a valid tensor"));
  std::string text = index_json({2}, {{"rank_0.safetensors", {{0, 2}}}});
  text.replace(text.find("\"F32\""), 5, "\"F33\"");
  CHECK(has(index_error(text), "tensor model/w is \"F33\" [2]: not a valid tensor"));
  // A slice outside the shape.
  CHECK(has(index_error(index_json({4, 3}, {{"rank_0.safetensors", {{0, 5}, {0, 3}}}})),
            "shard rank_0.safetensors (key k0, slice [0:5, 0:3]) is not inside the tensor along dim 0"));
}

TEST_CASE("safetensors: a header whose byte count overflows is refused at open") {
  Tmp t;
  const std::string path = t.path() + "/evil.safetensors";
  // [2^62+1, 4] F32 is 2^64 + 16 bytes: wrapped, it would match 16 bytes of data.
  write_raw(path, R"({"t":{"dtype":"F32","shape":[4611686018427387905,4],"data_offsets":[0,16]}})",
            std::string(16, '\1'));
  CHECK(has(error_of([&] { st::File f(path); }), "tensor t: F32 [4611686018427387905, 4] is not a valid tensor"));
  write_raw(path, R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", "");
  CHECK(has(error_of([&] { st::File f(path); }), "[4294967296, 4294967296] is not a valid tensor"));
  // An end offset so large that start + end would wrap past the file's size.
  write_raw(path, R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[18446744073709551610,18446744073709551612]}})", "ab");
  CHECK(has(error_of([&] { st::File f(path); }), "truncated: tensor t needs bytes up to past 2^64"));
}

TEST_CASE("coverage: every element in exactly one shard; overlaps and gaps named") {
  const std::string r0 = "rank_0.safetensors", r1 = "rank_1.safetensors";
  // A row split and a column split are complete.
  CHECK(index_error(index_json({4, 3}, {{r0, {{0, 2}, {0, 3}}}, {r1, {{2, 4}, {0, 3}}}})) == "(no error)");
  CHECK(index_error(index_json({4, 3}, {{r0, {{0, 4}, {0, 1}}}, {r1, {{0, 4}, {1, 3}}}})) == "(no error)");
  // Two copies of rows 0:2 of [4, 3]: an overlap (and half the tensor missing).
  std::string msg = index_error(index_json({4, 3}, {{r0, {{0, 2}, {0, 3}}}, {r1, {{0, 2}, {0, 3}}}}));
  CHECK(has(msg, "tensor model/w: shards rank_0.safetensors (key k0, slice [0:2, 0:3]) and rank_1.safetensors "
                 "(key k1, slice [0:2, 0:3]) overlap in region [0:2, 0:3]"));
  // A partial overlap along columns.
  msg = index_error(index_json({4, 3}, {{r0, {{0, 4}, {0, 2}}}, {r1, {{1, 3}, {1, 3}}}}));
  CHECK(has(msg, "overlap in region [1:3, 1:2]"));
  // A gap: rows 1:2 and columns 2:3 of rows 2:4 are in no shard; the first is named.
  msg = index_error(index_json({4, 3}, {{r0, {{0, 1}, {0, 3}}}, {r1, {{2, 4}, {0, 2}}}}));
  CHECK(has(msg, "tensor model/w [4, 3]: its 2 shard(s) hold 7 of its 12 elements; region [1:2, 0:2] is in no shard"));
  // A scalar held twice.
  CHECK(has(index_error(index_json(Json::array(), {{r0, Json::array()}, {r1, Json::array()}})), "overlap"));
  // No shards at all.
  CHECK(has(index_error(index_json({2}, {})), "tensor model/w has no shards"));
}

TEST_CASE("a FIFO or a link where a checkpoint file belongs is refused, never blocking") {
  Tmp t;
  const std::string fifo = t.path() + "/rank_0.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK(has(error_of([&] { st::File f(fifo); }), "rank_0.safetensors is a FIFO, not a regular file"));
  // The index of a checkpoint whose rank file is that FIFO: refused by the reader.
  std::ofstream(t.path() + "/index.json") << index_json({2}, {{"rank_0.safetensors", {{0, 2}}}}, {"rank_0.safetensors"});
  CHECK(has(error_of([&] { CheckpointReader r(t.path()); }), "rank_0.safetensors is a FIFO, not a regular file"));
  // `latest` as a FIFO.
  const std::string root = t.path() + "/root";
  fs::create_directories(root + "/step_1");
  REQUIRE(::mkfifo((root + "/latest").c_str(), 0644) == 0);
  CHECK(has(error_of([&] { latest_dir(root); }), "latest is a FIFO, not a regular file"));
  // A rank file that is a link to a file outside the step directory.
  const std::string dir = t.path() + "/linked";
  fs::create_directories(dir);
  std::vector<float> v = {1, 2};
  st::write_file(t.path() + "/outside.safetensors", {{"k0", "F32", {2}, v.data()}});
  fs::create_symlink(t.path() + "/outside.safetensors", dir + "/rank_0.safetensors");
  std::ofstream(dir + "/index.json") << index_json({2}, {{"rank_0.safetensors", {{0, 2}}}}, {"rank_0.safetensors"});
  CHECK(has(error_of([&] { CheckpointReader r(dir); }), "rank_0.safetensors is a symbolic link"));
  CHECK(has(error_of([&] { st::File f(dir + "/rank_0.safetensors"); }), "is a symbolic link"));
}

TEST_CASE("latest must name a step_<N> directory of its own checkpoint dir") {
  Tmp t;
  const std::string root = t.path() + "/ckpt";
  fs::create_directories(root + "/step_1");
  fs::create_directories(t.path() + "/other/step_5");
  for (const std::string& bad : std::vector<std::string>{"../other/step_5", t.path() + "/other/step_5",
                                                         "step_1/../../other/step_5", "previous"}) {
    CAPTURE(bad);
    std::ofstream(root + "/latest") << bad << "\n";
    const std::string msg = error_of([&] { latest_dir(root); });
    CHECK(has(msg, "latest names \"" + bad + "\", which is not a step_<N> directory of " + root));
    CHECK(has(error_of([&] { resolve(root); }), "latest names \"" + bad + "\""));
  }
  // A step_<N> name that is a link to another directory.
  fs::create_directory_symlink(t.path() + "/other/step_5", root + "/step_5");
  std::ofstream(root + "/latest") << "step_5\n";
  CHECK(has(error_of([&] { latest_dir(root); }), "which is not a checkpoint directory (it is a symbolic link)"));
  std::ofstream(root + "/latest") << "step_1\n";
  CHECK(latest_dir(root) == root + "/step_1");
}

TEST_CASE("keep never prunes inside a moved-aside previous_<time>/") {
  Tmp t;
  const std::string root = t.path() + "/ckpt/previous_20260101T000000Z";
  const std::vector<float> w = {1, 2};
  for (int step : {1, 2, 3}) {
    prepare_tmp_dir(root, step);
    ShardData s{{"model/w", "F32", {2}, {Shard{"", "w", {{0, 2}}, 0}}}, w.data()};
    write_rank_file(tmp_dir(root, step), "rank_0.safetensors", {s});
    Index x;
    x.files = {"rank_0.safetensors"};
    write_index(tmp_dir(root, step), x);
    commit(root, step, /*keep=*/1);
  }
  CHECK(list_steps(root) == std::vector<int64_t>{1, 2, 3});
  CHECK(latest_dir(root) == root + "/step_3");
}
