// data.format indexed through the real `dtrain launch`: a tiny GPT trains on a
// Megatron indexed dataset (written here by a minimal writer of the MMIDIDX
// layout; the agreement with megatron-core's own writer and reader is
// tests/unit/engine/indexed_data_test.cpp) and its loss falls; a damaged
// index is refused with exit 2 naming the file before any worker starts.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing;

constexpr int kVocab = 512, kSteps = 12;

template <typename T>
void put(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(char((uint64_t(v) >> (8 * i)) & 0xff));
}

// PREFIX.idx + PREFIX.bin, uint16 (dtype code 8), one sequence per document:
// each document is 5-29 "words" of four tokens from a table of sixteen, then
// the end-of-document id 0, so the next token is mostly predictable.
void write_indexed(const std::string& prefix, int documents) {
  std::string bin, lengths, pointers, docs;
  uint64_t x = 88172645463325252ULL;
  auto next = [&x] { return x ^= x << 13, x ^= x >> 7, x ^= x << 17; };
  put<int64_t>(docs, 0);
  for (int d = 0; d < documents; ++d) {
    put<int64_t>(pointers, int64_t(bin.size()));
    const int words = 5 + int(next() % 25);
    for (int w = 0; w < words; ++w) {
      const int word = int(next() % 16);
      for (int k = 0; k < 4; ++k) put<uint16_t>(bin, uint16_t(1 + (word * 4 + k) * 7 % (kVocab - 1)));
    }
    put<uint16_t>(bin, 0);
    put<int32_t>(lengths, 4 * words + 1);
    put<int64_t>(docs, d + 1);
  }
  std::string idx("MMIDIDX\0\0", 9);
  put<uint64_t>(idx, 1);
  idx.push_back(char(8));
  put<uint64_t>(idx, uint64_t(documents));
  put<uint64_t>(idx, uint64_t(documents + 1));
  write_file(prefix + ".idx", idx + lengths + pointers + docs);
  write_file(prefix + ".bin", bin);
}

std::pair<int, std::string> launch(const TempDir& dir, const std::string& name) {
  TagGuard tag;
  const std::vector<std::string> argv = {
      dtrain_bin(), "launch", dir / "spec.yaml", "--set", "log.dir=" + (dir / name),
      "--set", "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())};
  return run_command(argv, dir / (name + ".log"), 300, {tag.env(), "DTRAIN_NO_REBUILD=1"});
}

}  // namespace

TEST_CASE("data.format indexed: a tiny GPT trains on a Megatron indexed dataset; a bad index exits 2 first") {
  TempDir dir;
  write_indexed(dir / "corpus", 200);
  write_file(dir / "spec.yaml",
             "job: {name: indexed, seed: 1}\n"
             "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
             "model: {vocab: " + std::to_string(kVocab) + ", layers: 2, d_model: 32, heads: 2, seq_len: 32, dropout: 0.0}\n"
             "train: {steps: " + std::to_string(kSteps) + ", micro_batch: 8, lr: 3.0e-3, warmup_steps: 2}\n"
             "data: {path: " + (dir / "corpus") + ", format: indexed}\n"
             "log: {every: 1}\n");
  {
    auto [code, output] = launch(dir, "run");
    REQUIRE_MESSAGE(code == 0, output);
    const std::vector<double> losses = parity::read_metric(dir / "run/metrics.jsonl", "loss");
    REQUIRE(losses.size() == size_t(kSteps));
    MESSAGE("loss " << losses.front() << " -> " << losses.back() << " over " << kSteps << " steps");
    CHECK(losses.back() < losses.front() - 0.5);
  }
  // The version field set to 2: refused by the launcher, no worker log.
  std::string idx = read_file(dir / "corpus.idx");
  idx[9] = 2;
  write_file(dir / "corpus.idx", idx);
  auto [code, output] = launch(dir, "bad");
  INFO(output);
  CHECK(code == 2);  // a config error
  CHECK(output.find((dir / "corpus.idx") + ": version 2 is not 1") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "bad/rank_0.log"));
}
