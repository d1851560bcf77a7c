// Checkpoint format without LibTorch: safetensors round trip and layout,
// crc32c, index JSON, resharded region reads from two shards, every corruption
// that docs/ARCHITECTURE.md, 'Checkpoints', lists (flipped byte, truncated
// shard, missing rank file, shape mismatch, another model) with its message, the
// atomic directory protocol (commit, latest, keep, leftover .tmp) and merge.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_index.h"
#include "common/checkpoint_reader.h"
#include "common/checkpoint_writer.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "common/safetensors.h"

namespace fs = std::filesystem;
using namespace dtrain::checkpoint;
namespace st = dtrain::safetensors;

namespace {

struct Tmp {
  std::string path;
  Tmp() {
    char t[] = "/tmp/dtrain-ckpt-unit-XXXXXX";
    path = mkdtemp(t);
  }
  ~Tmp() { fs::remove_all(path); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dtrain::Error& e) {
    CHECK(e.code() == dtrain::ErrorCode::checkpoint);
    return e.what();
  }
  return "(no error)";
}

// A [4, 3] F32 "model/w" split by rows over two rank files, a [3] "model/b"
// in rank 0's only (a replicated tensor is written once, by one rank), and
// each rank's rng tensor.
std::vector<float> w_data() {
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[size_t(i)] = float(i) * 0.5f - 1.0f;
  return v;
}
const std::vector<float> kBias = {7.f, 8.f, 9.f};

void write_two_rank_checkpoint(const std::string& dir, const std::string& model = "toy") {
  fs::create_directories(dir);
  static const std::vector<float> w = w_data();
  static const std::vector<uint8_t> rng0(16, 3), rng1(16, 4);
  for (int r = 0; r < 2; ++r) {
    std::vector<ShardData> shards;
    TensorEntry e{"model/w", "F32", {4, 3}, {Shard{"", "model/w", {{2 * r, 2 * r + 2}, {0, 3}}, 0}}};
    shards.push_back({e, w.data() + 6 * r});
    TensorEntry b{"model/b", "F32", {3}, {Shard{"", "model/b", {{0, 3}}, 0}}};
    if (r == 0) shards.push_back({b, kBias.data()});
    TensorEntry g{"rng/cpu/rank_" + std::to_string(r), "U8", {16}, {Shard{"", "rng", {{0, 16}}, 0}}};
    shards.push_back({g, (r ? rng1 : rng0).data()});
    write_rank_file(dir, "rank_" + std::to_string(r) + ".safetensors", shards);
  }
  Index idx;
  idx.step = 20;
  idx.mesh = "dp=2,tp=1,pp=1,ep=1";
  idx.world = 2;
  idx.model = model;
  idx.sampler_consumed = 320;
  idx.optimizer_step = 20;
  idx.spec_yaml = "job: {name: toy}\n";
  idx.files = {"rank_0.safetensors", "rank_1.safetensors"};
  write_index(dir, idx);
}

void flip_byte(const std::string& path, long offset_from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-offset_from_end, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-offset_from_end, std::ios::end);
  f.put(char(c ^ 0x10));
}

}  // namespace

TEST_CASE("crc32c: known answer and incremental") {
  CHECK(dtrain::crc32c("123456789", 9) == 0xE3069283u);
  CHECK(dtrain::crc32c("", 0) == 0u);
  std::string s(1000, 'x');
  for (size_t i = 0; i < s.size(); ++i) s[i] = char(i * 31);
  CHECK(dtrain::crc32c_extend(dtrain::crc32c(s.data(), 333), s.data() + 333, 667) ==
        dtrain::crc32c(s.data(), s.size()));
}

TEST_CASE("safetensors: public layout and round trip") {
  Tmp t;
  const std::string path = t.path + "/a.safetensors";
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> b = {-1, 1LL << 40};
  auto crcs = st::write_file(path, {{"a", "F32", {2, 3}, a.data()}, {"b", "I64", {2}, b.data()}},
                             {{"k", "v"}});
  REQUIRE(crcs.size() == 2);
  CHECK(crcs[0] == dtrain::crc32c(a.data(), 24));
  // By hand, as any other reader would: u64 LE length, JSON, data.
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  auto j = nlohmann::json::parse(text);
  CHECK(j["a"]["dtype"] == "F32");
  CHECK(j["a"]["shape"] == std::vector<int>{2, 3});
  CHECK(j["a"]["data_offsets"] == std::vector<int>{0, 24});
  CHECK(j["b"]["data_offsets"] == std::vector<int>{24, 40});
  CHECK(j["__metadata__"]["k"] == "v");
  CHECK((8 + n) % 8 == 0);
  st::File f(path);
  CHECK(f.metadata().at("k") == "v");
  auto bytes = f.read("b");
  std::vector<int64_t> back(2);
  std::memcpy(back.data(), bytes.data(), 16);
  CHECK(back == b);
  CHECK(error_of([&] { f.at("zz"); }).find("has no tensor zz") != std::string::npos);
}

TEST_CASE("index: JSON round trip") {
  Index x;
  x.step = 7;
  x.mesh = "dp=1,tp=1,pp=1,ep=1";
  x.model = "m";
  x.schedule.lr = 0.5;
  x.schedule.total_steps = 9;
  x.spec_yaml = "a: 1\n";
  x.files = {"rank_0.safetensors"};
  x.tensors.push_back({"model/w", "F32", {2, 2}, {Shard{"rank_0.safetensors", "w", {{0, 2}, {0, 2}}, 0xdeadbeef}}});
  Index y = index_from_json(index_to_json(x), "t");
  CHECK(index_to_json(y) == index_to_json(x));
  CHECK(y.tensors[0].shards[0].crc32c == 0xdeadbeefu);
  CHECK(error_of([] { index_from_json("{}", "i.json"); }).find("i.json is not a dtrain checkpoint") !=
        std::string::npos);
}

TEST_CASE("reader: full tensors and regions across shards (resharding)") {
  Tmp t;
  write_two_rank_checkpoint(t.path);
  CheckpointReader r(t.path);
  CHECK(r.index().step == 20);
  CHECK(r.index().tensors.size() == 4);  // w, b, rng 0, rng 1
  CHECK(r.at("model/b").shards.size() == 1);
  auto w = r.read_full("model/w");
  CHECK(std::memcmp(w.data(), w_data().data(), 48) == 0);
  // Rows 1..3, columns 1..3: spans both shards.
  std::vector<float> part(4);
  r.read_region("model/w", {{1, 3}, {1, 3}}, part.data());
  auto full = w_data();
  CHECK(part == std::vector<float>{full[4], full[5], full[7], full[8]});
  CHECK(r.verify_all() == 2 * (24 + 16) + 12);
}

TEST_CASE("corruption: flipped byte names file, tensor and checksums") {
  Tmp t;
  write_two_rank_checkpoint(t.path);
  flip_byte(t.path + "/rank_0.safetensors", 20);  // inside model/b (12 B) + rng (16 B) at the end
  CheckpointReader r(t.path);
  auto msg = error_of([&] { r.verify_all(); });
  INFO(msg);
  CHECK(msg.find("rank_0.safetensors") != std::string::npos);
  CHECK(msg.find("tensor model/b") != std::string::npos);
  CHECK(msg.find("checksum mismatch") != std::string::npos);
}

TEST_CASE("corruption: truncated shard") {
  Tmp t;
  write_two_rank_checkpoint(t.path);
  fs::resize_file(t.path + "/rank_0.safetensors", fs::file_size(t.path + "/rank_0.safetensors") - 5);
  CheckpointReader r(t.path);
  auto msg = error_of([&] { r.read_full("model/w"); });
  INFO(msg);
  CHECK(msg.find("rank_0.safetensors: truncated") != std::string::npos);
  CHECK(msg.find("tensor rng") != std::string::npos);
}

TEST_CASE("corruption: missing rank file") {
  Tmp t;
  write_two_rank_checkpoint(t.path);
  fs::remove(t.path + "/rank_1.safetensors");
  auto msg = error_of([&] { CheckpointReader r(t.path); });
  INFO(msg);
  CHECK(msg.find("rank_1.safetensors is missing") != std::string::npos);
  CHECK(msg.find("model/w") != std::string::npos);
}

TEST_CASE("corruption: shape mismatch and another model") {
  Tmp t;
  write_two_rank_checkpoint(t.path);
  CheckpointReader r(t.path);
  check_compatible(r.index(), t.path, "toy", {{"model/w", "F32", {4, 3}}, {"model/b", "F32", {3}}});
  auto msg = error_of([&] {
    check_compatible(r.index(), t.path, "toy", {{"model/w", "F32", {4, 4}}, {"model/b", "F32", {3}}});
  });
  INFO(msg);
  CHECK(msg.find("tensor model/w is F32 [4, 3] in the checkpoint but F32 [4, 4] in the model") !=
        std::string::npos);
  msg = error_of([&] { check_compatible(r.index(), t.path, "gpt big", {{"model/x", "F32", {1}}}); });
  INFO(msg);
  CHECK(msg.find("holds model \"toy\" but this run builds \"gpt big\"") != std::string::npos);
  CHECK(msg.find("tensor model/x is missing") != std::string::npos);
  CHECK(msg.find("index.json") != std::string::npos);
}

TEST_CASE("corruption: a shard whose header disagrees with the index") {
  Tmp t;
  write_two_rank_checkpoint(t.path);
  // Replace rank_1 with a file whose model/w has another shape.
  std::vector<float> z(3, 0.f);
  st::write_file(t.path + "/rank_1.safetensors", {{"model/w", "F32", {1, 3}, z.data()}});
  CheckpointReader r(t.path);
  auto msg = error_of([&] { r.read_full("model/w"); });
  INFO(msg);
  CHECK(msg.find("rank_1.safetensors: tensor model/w is F32 [1, 3] but the index says F32 [2, 3]") !=
        std::string::npos);
}

TEST_CASE("atomic protocol: commit, latest, keep, leftover tmp") {
  Tmp t;
  const std::string root = t.path + "/ckpt";
  for (int step : {10, 20, 30, 40}) {
    prepare_tmp_dir(root, step);
    write_two_rank_checkpoint(tmp_dir(root, step));
    CHECK(latest_dir(root) == (step == 10 ? "" : root + "/step_" + std::to_string(step - 10)));
    commit(root, step, /*keep=*/2);
    CHECK(latest_dir(root) == root + "/step_" + std::to_string(step));
  }
  CHECK(list_steps(root) == std::vector<int64_t>{30, 40});
  CHECK(!fs::exists(root + "/latest.tmp"));
  // A crash mid-save: step_50.tmp half written, latest untouched.
  prepare_tmp_dir(root, 50);
  std::ofstream(tmp_dir(root, 50) + "/rank_0.safetensors") << "partial";
  CHECK(resolve(root) == root + "/step_40");
  CHECK(list_steps(root) == std::vector<int64_t>{30, 40});
  CheckpointReader r(resolve(root));
  CHECK(r.index().step == 20);  // the toy index's own step
  CHECK(clean_stale(root) == 1);
  CHECK(!fs::exists(tmp_dir(root, 50)));
  // The same step again replaces it.
  prepare_tmp_dir(root, 40);
  write_two_rank_checkpoint(tmp_dir(root, 40));
  commit(root, 40, 2);
  CHECK(list_steps(root) == std::vector<int64_t>{30, 40});
  CHECK(resolve(root + "/step_30") == root + "/step_30");
  CHECK(resolve(root + "/latest") == root + "/step_40");
  CHECK(error_of([&] { resolve(t.path); }).find("neither a checkpoint") != std::string::npos);
  std::ofstream(root + "/latest") << "step_99\n";
  CHECK(error_of([&] { latest_dir(root); }).find("names \"step_99\"") != std::string::npos);
}

TEST_CASE("merge: full tensors under the model's names") {
  Tmp t;
  write_two_rank_checkpoint(t.path + "/c");
  auto stats = merge(t.path + "/c", t.path + "/m.safetensors", false);
  CHECK(stats.tensors == 2);
  st::File f(t.path + "/m.safetensors");
  CHECK(f.tensors().size() == 2);
  CHECK(f.at("w").shape == std::vector<int64_t>{4, 3});
  auto w = f.read("w");
  CHECK(std::memcmp(w.data(), w_data().data(), 48) == 0);
  CHECK(f.metadata().at("dtrain.step") == "20");
}
