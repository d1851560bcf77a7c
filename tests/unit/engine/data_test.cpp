// Unit tests of engine/data: the token datasets (bytes and uint16 round trips
// on temporary files, errors that name data.path, a deterministic synthetic
// source) and the distributed sampler (disjoint, complete coverage for dp
// 1..5, layout-independent global batches, save/restore, seeding).
#include "common/error.h"
#include "engine/data/dataset.h"
#include "engine/data/sampler.h"

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
using dtrain::engine::data::DistributedSampler;
using dtrain::engine::data::open_dataset;
using dtrain::engine::data::SamplerState;

namespace {

// A temporary file removed when the test ends.
struct TempFile {
  explicit TempFile(const std::string& name, const std::string& bytes)
      : path(fs::temp_directory_path() / ("dtrain_data_test_" + std::to_string(::getpid()) + "_" + name)) {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  ~TempFile() { fs::remove(path); }
  fs::path path;
};

std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const dtrain::Error& e) {
    return e.message() + " | " + e.hint();
  }
  return "";
}

}  // namespace

TEST_CASE("dataset bytes: windows of seq_len + 1, stride seq_len") {
  std::string text;
  for (int i = 0; i < 41; ++i) text.push_back(char('a' + i % 26));
  TempFile f("bytes.txt", text);
  auto ds = open_dataset("bytes", f.path.string(), 8, 256, 0);
  CHECK(ds->num_samples() == 5);  // (41 - 1) / 8
  CHECK(ds->seq_len() == 8);
  at::Tensor x, y;
  ds->get_batch({4, 0}, x, y);
  REQUIRE(x.sizes() == at::IntArrayRef({2, 8}));  // [B, T]
  REQUIRE(y.sizes() == at::IntArrayRef({2, 8}));
  for (int t = 0; t < 8; ++t) {
    CHECK(x[0][t].item().toLong() == int64_t(text[size_t(32 + t)]));
    CHECK(y[0][t].item().toLong() == int64_t(text[size_t(33 + t)]));
    CHECK(x[1][t].item().toLong() == int64_t(text[size_t(t)]));
    CHECK(y[1][t].item().toLong() == int64_t(text[size_t(t + 1)]));
  }
  CHECK_THROWS_AS(ds->get_batch({5}, x, y), dtrain::Error);
}

TEST_CASE("dataset tokens-u16: little-endian round trip and vocabulary check") {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 33; ++i) tokens.push_back(uint16_t(i * 997 % 50000));
  std::string bytes;
  for (uint16_t t : tokens) {
    bytes.push_back(char(t & 0xff));
    bytes.push_back(char(t >> 8));
  }
  TempFile f("tokens.u16", bytes);
  auto ds = open_dataset("tokens-u16", f.path.string(), 4, 50000, 0);
  CHECK(ds->num_samples() == 8);  // (33 - 1) / 4
  at::Tensor x, y;
  ds->get_batch({3, 7}, x, y);
  for (int t = 0; t < 4; ++t) {
    CHECK(x[0][t].item().toLong() == tokens[size_t(12 + t)]);
    CHECK(y[0][t].item().toLong() == tokens[size_t(13 + t)]);
    CHECK(x[1][t].item().toLong() == tokens[size_t(28 + t)]);
    CHECK(y[1][t].item().toLong() == tokens[size_t(29 + t)]);
  }
  // A token >= vocab: the error names the file, the offset and the vocab.
  const std::string msg = error_message([&] { open_dataset("tokens-u16", f.path.string(), 4, 1000, 0); });
  INFO(msg);
  CHECK(msg.find(f.path.string()) != std::string::npos);
  CHECK(msg.find("byte offset 4") != std::string::npos);  // token 2 = 1994 is the first >= 1000
  CHECK(msg.find("1000") != std::string::npos);
  TempFile odd("odd.u16", "abc");
  CHECK(error_message([&] { open_dataset("tokens-u16", odd.path.string(), 1, 256, 0); }).find("odd") !=
        std::string::npos);
}

TEST_CASE("dataset errors name data.path and the fix") {
  const std::string missing = "/nonexistent/dtrain/corpus.txt";
  for (const char* format : {"bytes", "tokens-u16"}) {
    const std::string msg = error_message([&] { open_dataset(format, missing, 8, 256, 0); });
    INFO(format << ": " << msg);
    CHECK(msg.find(missing) != std::string::npos);
    CHECK(msg.find("scripts/make-corpus") != std::string::npos);
  }
  TempFile tiny("tiny.txt", "12345678");  // 8 tokens < seq_len + 1
  const std::string msg = error_message([&] { open_dataset("bytes", tiny.path.string(), 8, 256, 0); });
  INFO(msg);
  CHECK(msg.find(tiny.path.string()) != std::string::npos);
  CHECK(msg.find("too few") != std::string::npos);
  CHECK(!error_message([&] { open_dataset("parquet", missing, 8, 256, 0); }).empty());
}

// Truncating a file a tokens-u16 dataset had mapped made the next read of a
// sample past the new end SIGBUS: 3 pages of tokens, cut to 1, sample 1500 in page 3.
TEST_CASE("dataset: a file truncated or rewritten after open stops get_batch with a config error naming it") {
  for (const char* format : {"tokens-u16", "bytes"}) {
    CAPTURE(format);
    TempFile f(std::string("shrinks.") + format, std::string(12288, '\x01'));
    auto ds = open_dataset(format, f.path.string(), 4, 1024, 0);
    at::Tensor x, y;
    ds->get_batch({1500, 0}, x, y);
    CHECK(x[0][0].item().toLong() == (std::string(format) == "bytes" ? 1 : 0x0101));
    fs::resize_file(f.path, 4096);
    std::string msg;
    try {
      ds->get_batch({1500, 0}, x, y);
    } catch (const dtrain::Error& e) {
      CHECK(e.code() == dtrain::ErrorCode::config);
      msg = e.message() + " | " + e.hint();
    }
    INFO(msg);
    CHECK(msg.find("data.path = '" + f.path.string() + "' changed while training: size 12288 -> 4096 bytes") !=
          std::string::npos);
    CHECK(msg.find("put the original file back") != std::string::npos);
  }
  // The same size, other content: the modification time tells.
  TempFile f("rewritten.u16", std::string(64, '\x02'));
  auto ds = open_dataset("tokens-u16", f.path.string(), 4, 1024, 0);
  at::Tensor x, y;
  ds->get_batch({0}, x, y);
  std::ofstream(f.path, std::ios::binary) << std::string(64, '\x03');
  fs::last_write_time(f.path, fs::last_write_time(f.path) + std::chrono::seconds(2));  // coarse clocks
  const std::string msg = error_message([&] { ds->get_batch({0}, x, y); });
  INFO(msg);
  CHECK(msg.find("size 64 -> 64 bytes, modified ") != std::string::npos);
}

TEST_CASE("dataset synthetic: deterministic per seed, within vocab") {
  auto a = open_dataset("synthetic", "", 32, 100, 7);
  auto b = open_dataset("synthetic", "", 32, 100, 7);
  auto c = open_dataset("synthetic", "", 32, 100, 8);
  REQUIRE(a->num_samples() > 1000);
  at::Tensor xa, ya, xb, yb, xc, yc;
  const std::vector<int64_t> ids = {0, 17, a->num_samples() - 1};
  a->get_batch(ids, xa, ya);
  b->get_batch(ids, xb, yb);
  c->get_batch(ids, xc, yc);
  CHECK(at::equal(xa, xb));
  CHECK(at::equal(ya, yb));
  CHECK(!at::equal(xa, xc));
  CHECK(xa.max().item().toLong() < 100);
  CHECK(xa.min().item().toLong() >= 0);
  // Targets are inputs shifted by one.
  CHECK(at::equal(xa.narrow(1, 1, 31), ya.narrow(1, 0, 31)));
}

TEST_CASE("dataset synthetic: a vocab over 65536 (Llama 3's 128256) draws from all of it") {
  auto d = open_dataset("synthetic", "", 64, 128256, 7);
  std::vector<int64_t> ids(64);
  for (int64_t i = 0; i < 64; ++i) ids[size_t(i)] = i * (d->num_samples() / 64);
  at::Tensor x, y;
  d->get_batch(ids, x, y);
  const int64_t hi = x.max().item().toLong();
  MESSAGE("largest token of 64 x 64: " << hi << " (vocab 128256; a 16-bit store would cap it at 65535)");
  CHECK(hi < 128256);
  CHECK(hi > 65535);
  CHECK(x.min().item().toLong() >= 0);
}

TEST_CASE("sampler: disjoint, complete coverage over an epoch for dp 1..5") {
  for (int grad_accum : {1, 2}) {
    for (int dp = 1; dp <= 5; ++dp) {
      const int micro = 3;
      const int64_t gbs = int64_t(dp) * micro * grad_accum;
      const int64_t steps = 7;
      const int64_t n = gbs * steps;  // one epoch is exactly `steps` steps
      std::vector<DistributedSampler> ranks;
      for (int r = 0; r < dp; ++r) ranks.emplace_back(n, 11, dp, r, micro, grad_accum);
      DistributedSampler one(n, 11, 1, 0, micro * dp * grad_accum, 1);  // the 1-process layout
      std::vector<int64_t> seen;
      for (int64_t s = 0; s < steps; ++s) {
        std::vector<int64_t> step_union;
        for (int r = 0; r < dp; ++r) {
          for (int k = 0; k < grad_accum; ++k) {
            auto ids = ranks[size_t(r)].micro_batch_ids(k);
            CHECK(ids.size() == size_t(micro));
            step_union.insert(step_union.end(), ids.begin(), ids.end());
          }
          CHECK(ranks[size_t(r)].global_batch_ids() == one.global_batch_ids());
          ranks[size_t(r)].advance();
        }
        // Concatenated in rank order, the slices are the 1-process batch.
        CHECK(step_union == one.micro_batch_ids(0));
        seen.insert(seen.end(), step_union.begin(), step_union.end());
        one.advance();
      }
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) all[size_t(i)] = i;
      INFO("dp " << dp << " grad_accum " << grad_accum);
      CHECK(seen == all);  // every sample exactly once
      CHECK(ranks[0].epoch() == 1);
    }
  }
}

TEST_CASE("sampler: a new permutation each epoch; batches may straddle epochs") {
  const int64_t n = 10;
  DistributedSampler s(n, 5, 1, 0, 4, 1);
  std::vector<int64_t> order;
  for (int step = 0; step < 5; ++step) {  // 20 samples = 2 epochs
    auto ids = s.micro_batch_ids(0);
    order.insert(order.end(), ids.begin(), ids.end());
    s.advance();
  }
  std::vector<int64_t> e0(order.begin(), order.begin() + n), e1(order.begin() + n, order.end());
  CHECK(e0 != e1);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  CHECK(e0 == e1);
  CHECK(std::set<int64_t>(e0.begin(), e0.end()).size() == size_t(n));
}

TEST_CASE("sampler: same order after save/restore, on the same or another dp") {
  DistributedSampler a(97, 3, 2, 1, 4, 2);
  for (int i = 0; i < 5; ++i) a.advance();
  SamplerState saved = a.state();
  CHECK(saved.consumed == 5 * 16);
  std::vector<std::vector<int64_t>> expected;
  for (int i = 0; i < 10; ++i) {
    expected.push_back(a.global_batch_ids());
    a.advance();
  }
  DistributedSampler b(97, 3, 2, 1, 4, 2);
  b.load_state(saved);
  DistributedSampler c(97, 3, 4, 0, 2, 2);  // resumed on dp 4: same global batches
  c.load_state(saved);
  for (int i = 0; i < 10; ++i) {
    CHECK(b.global_batch_ids() == expected[size_t(i)]);
    CHECK(c.global_batch_ids() == expected[size_t(i)]);
    b.advance();
    c.advance();
  }
}

TEST_CASE("sampler: deterministic per seed") {
  DistributedSampler a(1000, 1, 1, 0, 64, 1), b(1000, 1, 1, 0, 64, 1), c(1000, 2, 1, 0, 64, 1);
  CHECK(a.global_batch_ids() == b.global_batch_ids());
  CHECK(a.global_batch_ids() != c.global_batch_ids());
  // Shuffled, not the identity.
  std::vector<int64_t> identity(64);
  for (int i = 0; i < 64; ++i) identity[size_t(i)] = i;
  CHECK(a.global_batch_ids() != identity);
  CHECK_THROWS_AS(DistributedSampler(10, 1, 2, 2, 1, 1), dtrain::Error);
}
