// A checkpoint is untrusted input, with the real `dtrain`: one genuine tiny
// checkpoint is trained once, then each case crafts a copy (a command in the
// stored spec, a path in the index, an overflowing shape, overlapping or
// missing shards, a FIFO as a rank file, a step inside a moved-aside
// archive, a `latest` that points outside) and checks that `ckpt inspect`,
// `ckpt merge` and `dtrain resume` / `launch` refuse it before any worker
// starts: the exit code, the message naming what is wrong, and every file
// of the case's directory the same before and after (nothing written, moved
// or deleted; no temporary left).
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "tests/support/child.h"
#include "tests/support/train_run.h"

namespace {

namespace fs = std::filesystem;
using dtrain::testing::TempDir;
using dtrain::testing::free_port;
using dtrain::testing::read_file;
using dtrain::testing::write_file;
using Json = nlohmann::ordered_json;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string spec_text(const std::string& dir) {
  return "job: {name: trust, seed: 3}\n"
         "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
         "model: {kind: gpt, vocab: 256, layers: 1, d_model: 16, heads: 2, seq_len: 16}\n"
         "train: {steps: 2, micro_batch: 2, lr: 1.0e-3, warmup_steps: 1}\n"
         "data: {path: " + dir + "/text.txt, format: bytes}\n"
         "checkpoint: {dir: " + dir + "/ckpt, every: 2, keep: 3}\n"
         "log: {dir: " + dir + "/run, every: 1}\n";
}

// The genuine checkpoint, trained once per test program: <dir>/ckpt/step_2.
const TempDir& genuine() {
  static TempDir dir;
  static bool trained = false;
  if (!trained) {
    write_file(dir / "text.txt", dtrain::testing::word_salad(8 * 1024, {"data ", "not ", "code\n"}));
    write_file(dir / "spec.yaml", spec_text(dir.path()));
    dtrain::testing::TagGuard tag;
    auto [code, out] = dtrain::testing::run_command(
        {dtrain::testing::dtrain_bin(), "launch", dir / "spec.yaml", "--set",
         "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())},
        dir / "train.log", 120, {tag.env(), "DTRAIN_NO_REBUILD=1"});
    INFO(out);
    REQUIRE(code == 0);
    REQUIRE(fs::is_regular_file(dir / "ckpt/step_2/index.json"));
    trained = true;
  }
  return dir;
}

// Every entry under root: type, size and a hash of the content (a FIFO is
// listed, never opened), so any write, move, delete or leftover shows.
std::map<std::string, std::string> tree(const std::string& root) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const auto st = it->symlink_status();
    std::string v;
    if (fs::is_symlink(st))
      v = "link " + fs::read_symlink(it->path()).string();
    else if (fs::is_fifo(st))
      v = "fifo";
    else if (fs::is_directory(st))
      v = "dir";
    else
      v = "file " + std::to_string(dtrain::crc32c(read_file(it->path()).data(), fs::file_size(it->path())));
    out[fs::relative(it->path(), root).string()] = v;
  }
  return out;
}

std::string tree_text(const std::map<std::string, std::string>& t) {
  std::string s;
  for (const auto& [k, v] : t) s += "  " + k + ": " + v + "\n";
  return s;
}

// A case's directory: <case>/ckpt/step_2 (a copy of the genuine one) and
// <case>/ckpt/latest; the crafting happens on top.
struct Case {
  TempDir dir;
  Case() {
    fs::create_directories(dir / "ckpt");
    fs::copy(genuine() / "ckpt/step_2", dir / "ckpt/step_2", fs::copy_options::recursive);
    write_file(dir / "ckpt/latest", "step_2\n");
  }
  std::string step() const { return dir / "ckpt/step_2"; }
  Json index() const { return Json::parse(read_file(step() + "/index.json")); }
  void set_index(const Json& j) const { write_file(step() + "/index.json", j.dump(1)); }

  // dtrain with the given arguments, its exit code and output; asserts the
  // case's directory is unchanged (and the refusal came within the timeout).
  std::pair<int, std::string> dtrain(std::vector<std::string> args, const std::string& log) const {
    const auto before = tree(dir.path());
    args.insert(args.begin(), dtrain::testing::dtrain_bin());
    dtrain::testing::TagGuard tag;
    auto r = dtrain::testing::run_command(args, genuine() / ("out-" + log), 30, {tag.env(), "DTRAIN_NO_REBUILD=1"});
    const auto after = tree(dir.path());
    INFO("before:\n" << tree_text(before) << "after:\n" << tree_text(after) << "output:\n" << r.second);
    CHECK_MESSAGE(before == after, log << ": the case's directory changed");
    return r;
  }
  std::pair<int, std::string> inspect() const { return dtrain({"ckpt", "inspect", step()}, "inspect"); }
  std::pair<int, std::string> merge() const {
    return dtrain({"ckpt", "merge", step(), dir / "merged.safetensors"}, "merge");
  }
  // resume with log.dir and data.path given again (inside the case dir), so
  // only what the case crafted can be refused.
  std::pair<int, std::string> resume(std::vector<std::string> sets = {}) const {
    std::vector<std::string> a = {"resume", "--ckpt", step(), "--set", "log.dir=" + (dir / "run"), "--set",
                                  "data.path=" + (genuine() / "text.txt"), "--set",
                                  "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())};
    for (auto& s : sets) a.insert(a.end(), {"--set", s});
    return dtrain(a, "resume");
  }
};

void expect(const std::pair<int, std::string>& r, int code, const std::vector<std::string>& parts) {
  INFO(r.second);
  CHECK(r.first == code);
  for (const auto& p : parts) CHECK_MESSAGE(has(r.second, p), "expected in the output: " << p);
  CHECK(!has(r.second, ": OK"));
  CHECK(!has(r.second, "merged "));
  CHECK(!has(r.second, "resuming from step"));  // no worker loaded anything
}

// The raw bytes of a safetensors file: 8-byte length, header, data.
void write_safetensors(const std::string& path, const Json& header, const std::string& data) {
  std::string h = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(h.size()) >> (8 * i)) & 0xff);
  write_file(path, out + h + data);
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// Adds tensor `name` to the index with one shard in file `file` (added to
// "files"), key "t", covering the whole shape, holding `data`.
void add_crafted_tensor(const Case& c, const std::string& name, const std::string& file,
                        const Json& shape, const std::string& data) {
  Json header = {{"t", {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {0, data.size()}}}}};
  write_safetensors(c.step() + "/" + file, header, data);
  Json j = c.index();
  j["files"].push_back(file);
  Json slice = Json::array();
  for (const auto& d : shape) slice.push_back({0, d});
  j["tensors"].push_back({{"name", name}, {"dtype", "F32"}, {"shape", shape},
                          {"shards", {{{"file", file}, {"key", "t"}, {"slice", slice},
                                       {"crc32c", hex32(dtrain::crc32c(data.data(), data.size()))}}}}});
  c.set_index(j);
}

}  // namespace

TEST_CASE("a command in the stored spec is shown and refused, never run") {
  Case c;
  const std::string marker = c.dir / "ran";
  Json j = c.index();
  std::string spec = j["spec"];
  const size_t at = spec.find("\nentrypoint:");
  REQUIRE(at != std::string::npos);
  const size_t end = spec.find('\n', at + 1);
  spec = spec.substr(0, at) + "\nentrypoint: [sh, -c, \"touch " + marker + "\"]" +
         (end == std::string::npos ? "\n" : spec.substr(end));
  j["spec"] = spec;
  c.set_index(j);
  auto r = c.resume();
  expect(r, 2, {"entrypoint = [\"sh\", \"-c\", \"touch " + marker + "\"]", "--set entrypoint=", "--spec FILE"});
  CHECK(!fs::exists(marker));
}

TEST_CASE("a stored log.dir or data.path is shown and refused unless given again") {
  Case c;
  const std::string stored_log = genuine() / "run", stored_data = genuine() / "text.txt";
  // log.dir not given again (data.path is): refused naming it.
  auto r = c.dtrain({"resume", "--ckpt", c.step(), "--set", "data.path=" + stored_data},
                    "resume-log");
  expect(r, 2, {"log.dir = \"" + stored_log + "\"", "--set log.dir=", "--spec FILE"});
  CHECK(!has(r.second, "data.path ="));
  // Nothing given again: both listed.
  r = c.dtrain({"resume", "--ckpt", c.step()}, "resume-both");
  expect(r, 2, {"log.dir = \"" + stored_log + "\"", "data.path = \"" + stored_data + "\""});
}

TEST_CASE("index file names outside the step directory are refused unopened") {
  for (const std::string& bad : {std::string("../../planted.safetensors"),
                                 std::string("../../../../../../../../../../../../etc/passwd"),
                                 std::string("/etc/passwd")}) {
    CAPTURE(bad);
    Case c;
    fs::copy_file(c.step() + "/rank_0.safetensors", c.dir / "planted.safetensors");
    Json j = c.index();
    j["files"] = {bad};
    for (auto& t : j["tensors"])
      for (auto& s : t["shards"]) s["file"] = bad;
    c.set_index(j);
    for (const auto& r : {c.inspect(), c.merge(), c.resume()}) {
      expect(r, 1, {"file \"" + bad + "\" is not a plain file name"});
      CHECK(!has(r.second, "header length"));  // /etc/passwd was never parsed
    }
  }
}

TEST_CASE("shapes whose element count overflows are refused before any copy") {
  struct Shape {
    Json shape;
    std::string data;
    std::string text;
  };
  for (const Shape& s : {Shape{{(1LL << 62) + 1, 4}, std::string(16, '\1'), "[4611686018427387905, 4]"},
                         Shape{{1LL << 32, 1LL << 32}, "", "[4294967296, 4294967296]"}}) {
    CAPTURE(s.text);
    Case c;
    add_crafted_tensor(c, "model/evil", "evil.safetensors", s.shape, s.data);
    for (const auto& r : {c.inspect(), c.merge()})
      expect(r, 1, {"tensor model/evil is \"F32\" " + s.text, "more than 2^63 bytes"});
  }
}

TEST_CASE("a shape claiming 1 GiB over a few bytes of file is refused before a buffer is sized") {
  Case c;
  // The shard file's header claims [16384, 16384] F32 but holds 16 bytes.
  add_crafted_tensor(c, "model/big", "big.safetensors", {16384, 16384}, std::string(16, '\2'));
  // Under a 768 MiB address-space limit a 1 GiB buffer cannot be made: a
  // merge that sized one first fails with bad_alloc instead of the check.
  const auto before = tree(c.dir.path());
  dtrain::testing::TagGuard tag;
  auto r = dtrain::testing::run_command(
      {"/bin/sh", "-c", "ulimit -v 786432 && exec \"$0\" ckpt merge \"$1\" \"$2\"",
       dtrain::testing::dtrain_bin(), c.step(), c.dir / "merged.safetensors"},
      genuine() / "out-big", 30, {tag.env()});
  CHECK(tree(c.dir.path()) == before);
  expect(r, 1, {"big.safetensors: tensor t: data_offsets [0, 16) hold 16 bytes but F32 [16384, 16384] needs 1073741824"});
  CHECK(!has(r.second, "bad_alloc"));
}

TEST_CASE("overlapping shards and a gap are named, not read as zeros") {
  struct Layout {
    std::string name;
    std::vector<std::pair<int, int>> rows;  // shards: row ranges of model/wte.weight
    std::vector<std::string> expect;
  };
  const std::vector<Layout> layouts = {
      {"overlap", {{0, 128}, {0, 128}}, {"tensor model/wte.weight: shards half.safetensors (key a, slice [0:128, 0:16]) "
                                         "and half.safetensors (key b, slice [0:128, 0:16]) overlap in region [0:128, 0:16]"}},
      {"gap", {{0, 128}}, {"tensor model/wte.weight [256, 16]: its 1 shard(s) hold 2048 of its 4096 elements; "
                           "region [128:256, 0:16] is in no shard"}},
  };
  for (const auto& l : layouts) {
    CAPTURE(l.name);
    Case c;
    // Rows 0:128 of the genuine embedding, as keys a and b of half.safetensors.
    const auto genuine_w = dtrain::testing::read_safetensors_f32(c.step() + "/rank_0.safetensors");
    REQUIRE(genuine_w.count("model/wte.weight"));
    const auto& w = genuine_w.at("model/wte.weight");
    REQUIRE(w.size() == 256 * 16);
    const std::string half(reinterpret_cast<const char*>(w.data()), 128 * 16 * 4);
    Json header = {{"a", {{"dtype", "F32"}, {"shape", {128, 16}}, {"data_offsets", {0, half.size()}}}},
                   {"b", {{"dtype", "F32"}, {"shape", {128, 16}}, {"data_offsets", {half.size(), 2 * half.size()}}}}};
    write_safetensors(c.step() + "/half.safetensors", header, half + half);
    Json j = c.index();
    j["files"].push_back("half.safetensors");
    for (auto& t : j["tensors"]) {
      if (t["name"] != "model/wte.weight") continue;
      t["shards"] = Json::array();
      const char* keys[] = {"a", "b"};
      for (size_t i = 0; i < l.rows.size(); ++i)
        t["shards"].push_back({{"file", "half.safetensors"}, {"key", keys[i]},
                               {"slice", {{l.rows[i].first, l.rows[i].second}, {0, 16}}},
                               {"crc32c", hex32(dtrain::crc32c(half.data(), half.size()))}});
    }
    c.set_index(j);
    for (const auto& r : {c.inspect(), c.merge(), c.resume()}) expect(r, 1, l.expect);
  }
}

TEST_CASE("a FIFO as a rank file is refused at once, nothing hangs") {
  Case c;
  fs::remove(c.step() + "/rank_0.safetensors");
  REQUIRE(::mkfifo((c.step() + "/rank_0.safetensors").c_str(), 0644) == 0);
  for (const auto& r : {c.inspect(), c.merge(), c.resume()})
    expect(r, 1, {"rank_0.safetensors is a FIFO, not a regular file"});
}

TEST_CASE("resuming from a moved-aside step does not make the archive a live directory") {
  Case c;
  // An archive as move_aside leaves it: previous_<time>/step_2 (and latest).
  const std::string archive = c.dir / "ckpt/previous_20260101T000000Z";
  fs::create_directories(archive);
  fs::rename(c.step(), archive + "/step_2");
  fs::rename(c.dir / "ckpt/latest", archive + "/latest");
  // More steps and keep 1 would prune the archive's step_2 if it were written to.
  auto r = c.dtrain({"resume", "--ckpt", archive + "/step_2", "--set", "log.dir=" + (c.dir / "run"), "--set",
                     "data.path=" + (genuine() / "text.txt"), "--set", "train.steps=4", "--set",
                     "checkpoint.every=1", "--set", "checkpoint.keep=1", "--set",
                     "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())},
                    "resume-archive");
  expect(r, 2, {"checkpoint.dir = " + archive + " is " + archive + ", a directory of steps moved aside",
                "--set checkpoint.dir=" + (c.dir / "ckpt")});
}

TEST_CASE("a `latest` pointing outside the checkpoint dir stops the launch, naming it") {
  Case c;
  fs::create_directories(c.dir / "other");
  fs::copy(c.step(), c.dir / "other/step_2", fs::copy_options::recursive);
  write_file(c.dir / "ckpt/latest", "../other/step_2\n");
  write_file(c.dir / "spec.yaml", spec_text(c.dir.path()));
  write_file(c.dir / "text.txt", read_file(genuine() / "text.txt"));
  auto r = c.dtrain({"launch", c.dir / "spec.yaml", "--set",
                     "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())},
                    "launch-latest");
  expect(r, 2, {"latest names \"../other/step_2\", which is not a step_<N> directory of " + (c.dir / "ckpt")});
  CHECK(!has(r.second, "moved"));
  // dtrain resume of that checkpoint dir refuses the same `latest`.
  r = c.dtrain({"resume", "--ckpt", c.dir / "ckpt"}, "resume-latest");
  expect(r, 1, {"latest names \"../other/step_2\""});
}
