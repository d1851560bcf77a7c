// Unit tests of data.format indexed and tokens-u32 (engine/data): datasets
// written and read back by megatron-core (tests/support/megatron_indexed.py,
// run once with the project's Python) give dtrain the same tokens in every
// window; each damaged copy (missing file, truncated .bin, magic, version,
// dtype code, token past the vocabulary) is a config error naming the file;
// int32 data read as uint16 misses.
#include "common/error.h"
#include "engine/data/dataset.h"

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
using dtrain::engine::data::open_dataset;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void spit(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// The reference datasets, written once per test program and removed at exit.
struct Reference {
  fs::path dir;
  std::string log;
  int rc = -1;
  Reference() : dir(fs::temp_directory_path() / ("dtrain_indexed_test_" + std::to_string(::getpid()))) {
    fs::create_directories(dir);
    const std::string cmd = std::string(DTRAIN_PYTHON) + " " + DTRAIN_SOURCE_DIR +
                            "/tests/support/megatron_indexed.py " + dir.string() + " > " + (dir / "log").string() +
                            " 2>&1";
    rc = std::system(cmd.c_str());
    log = slurp(dir / "log");
  }
  ~Reference() { fs::remove_all(dir); }
  std::string prefix(const std::string& name) const { return (dir / name).string(); }
  std::vector<int64_t> expected(const std::string& name) const {
    const std::string b = slurp(dir / (name + ".expected"));
    std::vector<int64_t> v(b.size() / 8);
    std::memcpy(v.data(), b.data(), v.size() * 8);
    return v;
  }
};

const Reference& reference() {
  static Reference r;
  INFO("megatron_indexed.py (needs megatron-core in the project's venv, scripts/install-deps): " << r.log);
  REQUIRE(r.rc == 0);
  return r;
}

std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const dtrain::Error& e) {
    CHECK(e.code() == dtrain::ErrorCode::config);
    return e.message() + " | " + e.hint();
  }
  return "";
}

// Every window of `prefix` at seq_len T, read in one batch, against the
// reference stream; returns how many tokens differ.
int64_t window_misses(const std::string& prefix, const std::vector<int64_t>& stream, int T, int vocab) {
  auto ds = open_dataset("indexed", prefix, T, vocab, 0);
  CHECK(ds->num_samples() == (int64_t(stream.size()) - 1) / T);
  std::vector<int64_t> ids;
  for (int64_t i = ds->num_samples() - 1; i >= 0; --i) ids.push_back(i);  // any order
  at::Tensor x, y;
  ds->get_batch(ids, x, y);
  int64_t misses = 0;
  for (size_t b = 0; b < ids.size(); ++b) {
    for (int t = 0; t < T; ++t) {
      misses += x[int64_t(b)][t].item().toLong() != stream[size_t(ids[b] * T + t)];
      misses += y[int64_t(b)][t].item().toLong() != stream[size_t(ids[b] * T + t + 1)];
    }
  }
  return misses;
}

}  // namespace

TEST_CASE("indexed: megatron-core's uint16 and int32 datasets give the same tokens in every window") {
  const Reference& r = reference();
  MESSAGE(r.log);
  for (const std::string name : {"u16", "i32"}) {
    CAPTURE(name);
    const std::vector<int64_t> stream = r.expected(name);
    REQUIRE(stream.size() > 500);
    for (int T : {1, 7, 64}) {
      CAPTURE(T);
      CHECK(window_misses(r.prefix(name), stream, T, 200000) == 0);
    }
  }
  // Negative control: the int32 pair with its dtype code set to uint16 (8).
  const fs::path bad = r.dir / "i32_as_u16";
  fs::copy_file(r.dir / "i32.bin", bad.string() + ".bin", fs::copy_options::overwrite_existing);
  std::string idx = slurp(r.dir / "i32.idx");
  idx[17] = 8;
  spit(bad.string() + ".idx", idx);
  const std::vector<int64_t> stream = r.expected("i32");
  const int64_t misses = window_misses(bad.string(), stream, 7, 200000);
  MESSAGE("int32 read as uint16: " << misses << " of " << 2 * 7 * ((stream.size() - 1) / 7) << " tokens differ");
  CHECK(misses > int64_t(stream.size()));
}

// Megatron's builder writes sequences back to back; the format allows any
// pointers. The uint16 reference with its sequences stored in reverse order
// in .bin (pointers rewritten) reads as the same stream.
TEST_CASE("indexed: sequences stored out of order in .bin read in index order") {
  const Reference& r = reference();
  std::string idx = slurp(r.dir / "u16.idx");
  const std::string bin = slurp(r.dir / "u16.bin");
  uint64_t n = 0;
  std::memcpy(&n, idx.data() + 18, 8);
  const size_t lengths_at = 34, pointers_at = 34 + 4 * n;
  std::string reversed;
  for (size_t i = n; i-- > 0;) {
    int32_t len = 0;
    int64_t ptr = 0;
    std::memcpy(&len, idx.data() + lengths_at + 4 * i, 4);
    std::memcpy(&ptr, idx.data() + pointers_at + 8 * i, 8);
    const int64_t moved = int64_t(reversed.size());
    reversed += bin.substr(size_t(ptr), size_t(2 * len));
    std::memcpy(&idx[pointers_at + 8 * i], &moved, 8);
  }
  REQUIRE(reversed.size() == bin.size());
  const std::string p = r.prefix("reversed");
  spit(p + ".idx", idx);
  spit(p + ".bin", reversed);
  CHECK(window_misses(p, r.expected("u16"), 7, 65536) == 0);
  CHECK(window_misses(p, r.expected("u16"), 64, 65536) == 0);
}

TEST_CASE("indexed: every damaged pair is a config error naming the file and what was found") {
  const Reference& r = reference();
  const std::string idx = slurp(r.dir / "u16.idx"), bin = slurp(r.dir / "u16.bin");
  const std::string p = r.prefix("bad");
  auto expect = [&](const std::string& what, const std::string& file, const std::string& found, int vocab = 65536) {
    CAPTURE(what);
    const std::string msg = error_message([&] { open_dataset("indexed", p, 8, vocab, 0); });
    INFO(msg);
    CHECK(msg.find(file) != std::string::npos);
    CHECK(msg.find(found) != std::string::npos);
    fs::remove(p + ".idx");
    fs::remove(p + ".bin");
  };
  spit(p + ".bin", bin);
  expect("missing .idx", p + ".idx", "cannot stat");
  spit(p + ".idx", idx);
  expect("missing .bin", p + ".bin", "cannot stat");
  spit(p + ".idx", idx);
  spit(p + ".bin", bin.substr(0, bin.size() / 2));
  expect("truncated .bin", p + ".bin", "is " + std::to_string(bin.size() / 2) + " bytes");
  std::string m = idx;
  m[0] = 'X';
  spit(p + ".idx", m);
  spit(p + ".bin", bin);
  expect("magic", p + ".idx", "magic 'XMIDIDX");
  m = idx;
  m[9] = 2;
  spit(p + ".idx", m);
  spit(p + ".bin", bin);
  expect("version", p + ".idx", "version 2 is not 1");
  for (char code : {char(0), char(9), char(7)}) {
    m = idx;
    m[17] = code;
    spit(p + ".idx", m);
    spit(p + ".bin", bin);
    expect("dtype", p + ".idx", "dtype code " + std::to_string(int(code)));
  }
  spit(p + ".idx", idx.substr(0, idx.size() - 8));
  spit(p + ".bin", bin);
  expect("truncated .idx", p + ".idx", "(truncated)");
  // The largest uint16 id of the reference is above 60000 (uniform in [1, 65000)).
  spit(p + ".idx", idx);
  spit(p + ".bin", bin);
  expect("token >= vocab", p + ".bin", "outside [0, model.vocab = 60000)", 60000);
}

TEST_CASE("dataset tokens-u32: little-endian round trip past 65535 and vocabulary check") {
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 33; ++i) tokens.push_back(i * 9973 % 128256);
  std::string bytes;
  for (uint32_t t : tokens)
    for (int k = 0; k < 4; ++k) bytes.push_back(char((t >> (8 * k)) & 0xff));
  const fs::path f = fs::temp_directory_path() / ("dtrain_u32_test_" + std::to_string(::getpid()));
  spit(f, bytes);
  auto ds = open_dataset("tokens-u32", f.string(), 4, 128256, 0);
  CHECK(ds->num_samples() == 8);  // (33 - 1) / 4
  at::Tensor x, y;
  ds->get_batch({3, 7}, x, y);
  for (int t = 0; t < 4; ++t) {
    CHECK(x[0][t].item().toLong() == tokens[size_t(12 + t)]);
    CHECK(y[0][t].item().toLong() == tokens[size_t(13 + t)]);
    CHECK(x[1][t].item().toLong() == tokens[size_t(28 + t)]);
    CHECK(y[1][t].item().toLong() == tokens[size_t(29 + t)]);
  }
  const std::string msg = error_message([&] { open_dataset("tokens-u32", f.string(), 4, 70000, 0); });
  INFO(msg);
  CHECK(msg.find(f.string()) != std::string::npos);
  CHECK(msg.find("token 79784 at byte offset 32") != std::string::npos);  // token 8 = 79784 is the first >= 70000
  spit(f, bytes.substr(0, 6));
  CHECK(error_message([&] { open_dataset("tokens-u32", f.string(), 1, 256, 0); }).find("not a multiple of 4") !=
        std::string::npos);
  fs::remove(f);
}
