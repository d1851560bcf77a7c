// Unit tests of the indexed training data (engine/data/indexed_blend.h):
// documents stay whole and are shuffled per epoch (differently each epoch);
// the blending rule agrees with megatron-core's build_blending_indices
// (tests/support/megatron_blend.py) and a 0.8/0.2 blend draws its shares
// within 1% over 200 steps; stopping at step 100 and resuming, or drawing at
// dp 2, gives the same samples as one uninterrupted dp 1 run.
#include "common/error.h"
#include "engine/data/indexed_blend.h"
#include "engine/data/sampler.h"

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
using namespace dtrain::engine::data;

namespace {

template <typename T>
void put(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(char((uint64_t(v) >> (8 * i)) & 0xff));
}

// PREFIX.idx/.bin (uint16): document d is `len(d)` tokens base + 100*d + i
// (i = 0..len-1, len 5..40), so a token names its document and place.
// Documents 3 and 4 are two sequences each (Megatron's document index).
struct Corpus {
  fs::path dir;
  Corpus() : dir(fs::temp_directory_path() / ("dtrain_blend_test_" + std::to_string(::getpid()))) {
    fs::create_directories(dir);
  }
  ~Corpus() { fs::remove_all(dir); }
  std::string write(const std::string& name, int documents, int base) const {
    std::string bin, lengths, pointers, docs;
    int64_t sequences = 0;
    put<int64_t>(docs, 0);
    for (int d = 0; d < documents; ++d) {
      const int len = 5 + (d * 7919) % 36;
      const int cut = (d == 3 || d == 4) ? len / 2 : len;
      for (auto [from, to] : {std::pair{0, cut}, std::pair{cut, len}}) {
        if (from == to) continue;
        put<int64_t>(pointers, int64_t(bin.size()));
        for (int i = from; i < to; ++i) put<uint16_t>(bin, uint16_t(base + 100 * d + i));
        put<int32_t>(lengths, to - from);
        ++sequences;
      }
      put<int64_t>(docs, sequences);
    }
    std::string idx("MMIDIDX\0\0", 9);
    put<uint64_t>(idx, 1);
    idx.push_back(char(8));
    put<uint64_t>(idx, uint64_t(sequences));
    put<uint64_t>(idx, uint64_t(documents + 1));
    const std::string prefix = (dir / name).string();
    std::ofstream(prefix + ".idx", std::ios::binary) << idx + lengths + pointers + docs;
    std::ofstream(prefix + ".bin", std::ios::binary) << bin;
    return prefix;
  }
};

// The samples of positions [first, first + n) as rows of T+1 tokens.
std::vector<std::vector<int64_t>> rows(const TokenDataset& ds, const std::vector<int64_t>& positions) {
  at::Tensor x, y;
  ds.get_batch(positions, x, y);
  std::vector<std::vector<int64_t>> out;
  for (int64_t b = 0; b < x.size(0); ++b) {
    std::vector<int64_t> r;
    for (int64_t t = 0; t < x.size(1); ++t) r.push_back(x[b][t].item().toLong());
    r.push_back(y[b][x.size(1) - 1].item().toLong());
    out.push_back(r);
  }
  return out;
}

std::vector<int64_t> range(int64_t first, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = first + i;
  return v;
}

// Every sample of steps [from_step, steps) at this layout, in global order;
// each dp rank opens its own dataset, as each worker does.
std::vector<std::vector<int64_t>> draw(const std::function<std::unique_ptr<TokenDataset>()>& open, int dp, int micro,
                                       int accum, int64_t from_step, int64_t steps, SamplerState start = {}) {
  std::vector<std::unique_ptr<TokenDataset>> data;
  std::vector<DistributedSampler> ranks;
  for (int d = 0; d < dp; ++d) {
    data.push_back(open());
    ranks.emplace_back(data.back()->num_samples(), 11, dp, d, micro, accum, /*shuffle=*/false);
    ranks.back().load_state(start);
  }
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = from_step; s < steps; ++s) {
    for (int d = 0; d < dp; ++d)
      for (int m = 0; m < accum; ++m)
        for (auto& row : rows(*data[size_t(d)], ranks[size_t(d)].micro_batch_ids(m))) out.push_back(row);
    for (auto& r : ranks) r.advance();
  }
  return out;
}

}  // namespace

TEST_CASE("indexed training: documents stay whole and are shuffled per epoch, every window once") {
  Corpus c;
  const std::string p = c.write("docs", 60, 0);
  const int T = 16;
  auto ds = open_indexed_training({{p, 1.0}}, T, 8000, 3);
  const int64_t n = ds->num_samples();
  std::vector<std::set<std::pair<int64_t, int64_t>>> joins(2);  // (doc before, doc after) per epoch
  for (int64_t e = 0; e < 2; ++e) {
    std::multiset<int64_t> inputs;
    for (const auto& r : rows(*ds, range(e * n, n))) {
      for (int t = 0; t < T; ++t) inputs.insert(r[size_t(t)]);
      for (int t = 0; t < T; ++t) {
        const int64_t a = r[size_t(t)], b = r[size_t(t + 1)];
        const int64_t len_a = 5 + (a / 100 * 7919) % 36;
        // Within a document the next token is the next place; across, a whole
        // document ended (a's place is its last) and another begins at place 0.
        const bool ok = b == a + 1 || (a % 100 == len_a - 1 && b % 100 == 0 && b / 100 != a / 100);
        CHECK_MESSAGE(ok, "epoch " << e << ": " << a << " then " << b);
        if (b != a + 1) joins[size_t(e)].emplace(a / 100, b / 100);
      }
    }
    // Inputs cover [0, n*T) of the epoch's stream: each token at most once.
    CHECK(int64_t(inputs.size()) == n * T);
    for (int64_t v : inputs) CHECK(inputs.count(v) == 1);
  }
  int64_t in_order = 0;
  for (const auto& [a, b] : joins[0]) in_order += b == a + 1;
  MESSAGE("epoch 0: " << joins[0].size() << " document joins, " << in_order << " in index order; epochs 0 and 1 share "
                      << [&] { int k = 0; for (const auto& j : joins[0]) k += int(joins[1].count(j)); return k; }());
  CHECK(in_order < 10);  // index order would be 59 of 59
  CHECK(joins[0] != joins[1]);
}

TEST_CASE("BlendSchedule matches megatron-core's build_blending_indices") {
  const std::vector<double> weights = {0.5, 0.3, 0.2};
  const int n = 1000;
  const fs::path out = fs::temp_directory_path() / ("dtrain_blend_ref_" + std::to_string(::getpid()));
  const std::string cmd = std::string(DTRAIN_PYTHON) + " " + DTRAIN_SOURCE_DIR +
                          "/tests/support/megatron_blend.py 0.5,0.3,0.2 " + std::to_string(n) + " " + out.string() +
                          " > " + out.string() + ".log 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(out.string() + ".log");
  INFO("megatron_blend.py (megatron-core in the venv, scripts/install-deps): "
       << std::string(std::istreambuf_iterator<char>(log), {}));
  REQUIRE(rc == 0);
  std::ifstream ref(out, std::ios::binary);
  std::vector<int64_t> expected(2 * n);
  ref.read(reinterpret_cast<char*>(expected.data()), std::streamsize(expected.size() * 8));
  fs::remove(out);
  fs::remove(out.string() + ".log");
  BlendSchedule mine(weights), fresh(weights);
  int misses = 0;
  for (int i = 0; i < n; ++i) {
    const auto d = mine.at(i);
    misses += d.source != expected[size_t(2 * i)] || d.index != expected[size_t(2 * i + 1)];
  }
  // A cursor that jumps back restarts and agrees.
  misses += fresh.at(700).index != mine.at(700).index || fresh.at(10).index != expected[21];
  MESSAGE(misses << " of " << n << " positions differ from megatron-core");
  CHECK(misses == 0);
  // Negative control: equal weights differ from the reference at many positions.
  BlendSchedule equal({1, 1, 1});
  int control = 0;
  for (int i = 0; i < n; ++i) control += equal.at(i).source != expected[size_t(2 * i)];
  MESSAGE("equal weights: " << control << " of " << n << " sources differ");
  CHECK(control > n / 10);
}

TEST_CASE("blend 0.8/0.2: tokens per source within 1% over 200 steps; resume and dp 2 draw the same samples") {
  Corpus c;
  const std::string a = c.write("alpha", 50, 0), b = c.write("beta", 30, 5000);  // beta's tokens >= 5000
  const int T = 8, accum = 2;  // global batch 4
  auto open = [&](uint64_t seed) {
    return [&, seed] { return open_indexed_training({{a, 0.8}, {b, 0.2}}, T, 8192, seed); };
  };
  const auto straight = draw(open(7), 1, 4, 1, 0, 200);
  REQUIRE(straight.size() == 800);
  int64_t beta_rows = 0;
  for (const auto& r : straight) beta_rows += r[0] >= 5000;
  const double beta_share = double(beta_rows) / double(straight.size());
  const auto tokens = open(7)()->source_tokens(800);
  MESSAGE("beta share " << beta_share << " (0.2 wanted); data_tokens alpha " << tokens[0].second << " beta "
                        << tokens[1].second);
  CHECK(std::abs(beta_share - 0.2) < 0.01);
  CHECK(tokens[0].first == "alpha");
  CHECK(tokens[1].second == beta_rows * T);
  CHECK(tokens[0].second + tokens[1].second == 800 * T);
  // Stop after step 100: a fresh dataset resumes from the sampler's position.
  auto differing = [&](const std::vector<std::vector<int64_t>>& got, size_t from) {
    int64_t n = 0;
    for (size_t i = 0; i < got.size(); ++i) n += i + from >= straight.size() || got[i] != straight[i + from];
    return n;
  };
  const auto resumed = draw(open(7), 1, 4, 1, 100, 200, SamplerState{400});
  REQUIRE(resumed.size() == 400);
  // dp 2 with 2 micro-steps of 1 each: the same global batches in the same order.
  const auto dp2 = draw(open(7), 2, 1, accum, 0, 200);
  REQUIRE(dp2.size() == 800);
  const int64_t resume_diff = differing(resumed, 400), dp2_diff = differing(dp2, 0);
  MESSAGE("resumed at step 100: " << resume_diff << " of 400 samples differ; dp 2: " << dp2_diff << " of 800");
  CHECK(resume_diff == 0);
  CHECK(dp2_diff == 0);
  // Negative control: another job seed draws other samples.
  const auto control = draw(open(8), 1, 4, 1, 0, 200);
  int64_t differ = 0;
  for (size_t i = 0; i < control.size(); ++i) differ += control[i] != straight[i];
  MESSAGE("seed 8 vs 7: " << differ << " of 800 samples differ");
  CHECK(differ > 400);
}
