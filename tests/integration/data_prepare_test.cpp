// `dtrain data prepare` and data.blend through the real binaries: a BPE
// tokenizer trained here by `tokenizers` on data/corpus.txt; every prepared
// document's ids equal tokenizers' encode and megatron-core's IndexedDataset
// reads them (tests/support/data_prepare_ref.py); each bad input exits 2
// naming the file; `dtrain validate` refuses damaged or mismatched datasets
// before any worker; a 0.8/0.2 blend trains a tiny GPT for 200 steps with
// its shares in data_tokens, a SIGTERM stop mid-run and its relaunch, and dp 2 x tp 2 reproduce it;
// a Llama trains on data prepared with a ~32k BPE and its val_loss falls.
#include <doctest/doctest.h>

#include <csignal>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/support/parity.h"

namespace {

using namespace dtrain::testing;
namespace fs = std::filesystem;

// The tokenizer and inputs, made once per program (about 5 s of BPE training).
struct Inputs {
  TempDir dir;
  int rc = -1;
  std::string log;
  Inputs() {
    const std::string corpus = source_dir() + "/data/corpus.txt";
    if (!fs::exists(corpus)) std::system((source_dir() + "/scripts/make-corpus > /dev/null 2>&1").c_str());
    std::tie(rc, log) = run_command({python(), source_dir() + "/tests/support/data_prepare_ref.py", "make", corpus,
                                     dir.path()},
                                    dir / "make.log", 300);
  }
};
const Inputs& inputs() {
  static Inputs in;
  INFO("data_prepare_ref.py make (tokenizers and megatron-core in the venv): " << in.log);
  REQUIRE(in.rc == 0);
  return in;
}

std::pair<int, std::string> prepare(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {dtrain_bin(), "data", "prepare"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, log, 300);
}

// A tiny GPT on the prepared data (vocab 1000): few tokens per step; a
// constant lr after warmup, so a 20-step run's steps are the 200-step run's.
std::string spec_text(const std::string& data) {
  return "job: {name: blend, seed: 5}\n"
         "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
         "model: {vocab: 1000, layers: 1, d_model: 16, heads: 2, seq_len: 16, dropout: 0.0}\n"
         "train: {steps: 200, micro_batch: 4, lr: 3.0e-3, min_lr: 3.0e-3, warmup_steps: 2, precision: fp32}\n"
         "data: " + data + "\n"
         "log: {every: 1}\n";
}

// data_tokens of every record of a metrics.jsonl, by step: {source: tokens}.
std::map<int, std::map<std::string, long long>> data_tokens(const std::string& metrics) {
  std::map<int, std::map<std::string, long long>> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto s = line.find("\"step\": "), d = line.find("\"data_tokens\": {");
    if (s == std::string::npos || d == std::string::npos) continue;
    auto& m = out[std::atoi(line.c_str() + s + 8)];
    for (size_t at = d + 16; line[at] == '"' || line[at] == ',' || line[at] == ' ';) {
      if (line[at] != '"') { ++at; continue; }
      const size_t end = line.find('"', at + 1);
      m[line.substr(at + 1, end - at - 1)] = std::atoll(line.c_str() + end + 3);
      at = line.find_first_of(",}", end);
      if (line[at] == '}') break;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("data prepare: every document's ids are tokenizers' encode, read back by megatron-core") {
  const Inputs& in = inputs();
  auto [code, output] = prepare({"--tokenizer", in.dir / "tok.json", "--input", in.dir / "a.jsonl", in.dir / "c.txt",
                                 in.dir / "d.txt", "--output", in.dir / "abc", "--append-eod"},
                                in.dir / "prepare.log");
  INFO(output);
  REQUIRE(code == 0);
  MESSAGE(output.substr(output.find("prepared")));
  CHECK(output.find("running " + python()) != std::string::npos);  // says which Python
  CHECK(output.find("242 documents") != std::string::npos);  // 240 lines + one document per text file
  auto [rc, check] = run_command({python(), source_dir() + "/tests/support/data_prepare_ref.py", "check", in.dir.path(),
                                  in.dir / "abc", in.dir / "a.jsonl", in.dir / "c.txt", in.dir / "d.txt", "--eod"},
                                 in.dir / "check.log", 300);
  MESSAGE(check);
  CHECK(rc == 0);
  const std::string record = read_file(in.dir / "abc.json");
  CHECK(record.find("\"vocab_size\": 1000") != std::string::npos);
  CHECK(record.find("\"eod_id\": 0") != std::string::npos);
}

TEST_CASE("data prepare: bad input exits 2 naming the file (and line), leaving no PREFIX.*") {
  const Inputs& in = inputs();
  const std::string tok = in.dir / "tok.json";
  auto expect = [&](const std::string& what, std::vector<std::string> args, const std::string& needle) {
    CAPTURE(what);
    const std::string out = in.dir / "bad/out";
    fs::create_directories(in.dir / "bad");
    auto [code, output] = prepare(args, in.dir / "bad.log");
    INFO(output);
    CHECK(code == 2);
    CHECK(output.find(needle) != std::string::npos);
    CHECK(fs::is_empty(in.dir / "bad"));  // no PREFIX.*, no temporary
    fs::remove_all(in.dir / "bad");
  };
  const std::string out = in.dir / "bad/out";
  write_file(in.dir / "broken_tok.json", "{\"model\": ");
  expect("tokenizer", {"--tokenizer", in.dir / "broken_tok.json", "--input", in.dir / "a.jsonl", "--output", out},
         in.dir / "broken_tok.json: not a tokenizers JSON file");
  write_file(in.dir / "notjson.jsonl", "{\"text\": \"one\"}\n{\"text\": \"two\"}\n{\"text\": tree}\n");
  expect("not JSON", {"--tokenizer", tok, "--input", in.dir / "notjson.jsonl", "--output", out},
         in.dir / "notjson.jsonl:3: not JSON");
  write_file(in.dir / "nokey.jsonl", "{\"text\": \"one\"}\n{\"body\": \"two\"}\n");
  expect("no key", {"--tokenizer", tok, "--input", in.dir / "nokey.jsonl", "--output", out},
         in.dir / "nokey.jsonl:2: no \"text\" field");
  expect("other key", {"--tokenizer", tok, "--input", in.dir / "a.jsonl", "--output", out, "--text-key", "body"},
         in.dir / "a.jsonl:1: no \"body\" field");
  expect("missing input", {"--tokenizer", tok, "--input", in.dir / "nowhere.jsonl", "--output", out},
         "--input " + (in.dir / "nowhere.jsonl") + ": No such file or directory");
  expect("missing tokenizer", {"--tokenizer", in.dir / "none.json", "--input", in.dir / "d.txt", "--output", out},
         "--tokenizer " + (in.dir / "none.json") + ": No such file or directory");
  // An existing prefix: refused without --force (the file untouched), replaced with it.
  const std::string keep = in.dir / "keep";
  REQUIRE(prepare({"--tokenizer", tok, "--input", in.dir / "d.txt", "--output", keep}, in.dir / "k.log").first == 0);
  write_file(keep + ".bin", "precious");
  auto [code, output] = prepare({"--tokenizer", tok, "--input", in.dir / "c.txt", "--output", keep}, in.dir / "k.log");
  INFO(output);
  CHECK(code == 2);
  CHECK(output.find(keep + ".bin already exists (8 bytes)") != std::string::npos);
  CHECK(read_file(keep + ".bin") == "precious");
  CHECK(prepare({"--tokenizer", tok, "--input", in.dir / "c.txt", "--output", keep, "--force"}, in.dir / "k.log").first ==
        0);
  CHECK(read_file(keep + ".idx").substr(0, 7) == "MMIDIDX");
  CHECK(read_file(keep + ".bin") != "precious");
}

TEST_CASE("dtrain validate: damaged or mismatched indexed data and bad blends exit 2 naming the file") {
  const Inputs& in = inputs();
  const std::string good = in.dir / "v";
  REQUIRE(prepare({"--tokenizer", in.dir / "tok.json", "--input", in.dir / "b.jsonl", "--output", good},
                  in.dir / "v.log").first == 0);
  const std::string idx = read_file(good + ".idx"), bin = read_file(good + ".bin"), rec = read_file(good + ".json");
  const std::string p = in.dir / "damaged";
  write_file(in.dir / "v.yaml", spec_text("{path: " + p + ", format: indexed}"));
  auto expect = [&](const std::string& what, const std::string& i, const std::string& b, const std::string& needle,
                    std::vector<std::string> sets = {}, const std::string& record = "") {
    CAPTURE(what);
    fs::remove(p + ".idx"), fs::remove(p + ".bin"), fs::remove(p + ".json");
    if (!i.empty()) write_file(p + ".idx", i);
    if (!b.empty()) write_file(p + ".bin", b);
    write_file(p + ".json", record.empty() ? rec : read_file(record));
    std::vector<std::string> argv = {dtrain_bin(), "validate", in.dir / "v.yaml"};
    for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
    auto [code, output] = run_command(argv, in.dir / "validate.log", 60);
    INFO(output);
    CHECK(code == 2);
    CHECK(output.find(needle) != std::string::npos);
  };
  // Control: the intact copy passes.
  write_file(p + ".idx", idx);
  write_file(p + ".bin", bin);
  write_file(p + ".json", rec);
  {
    auto [code, output] = run_command({dtrain_bin(), "validate", in.dir / "v.yaml"}, in.dir / "validate.log", 60);
    INFO(output);
    CHECK(code == 0);
  }
  expect("missing .idx", "", bin, p + ".idx: cannot stat");
  expect("missing .bin", idx, "", p + ".bin: cannot stat");
  expect("truncated .bin", idx, bin.substr(0, bin.size() / 2), p + ".bin: is " + std::to_string(bin.size() / 2) + " bytes");
  std::string m = idx;
  m[0] = 'X';
  expect("magic", m, bin, p + ".idx: magic 'XMIDIDX");
  m = idx;
  m[9] = 3;
  expect("version", m, bin, p + ".idx: version 3 is not 1");
  m = idx;
  m[17] = 11;
  expect("dtype", m, bin, p + ".idx: dtype code 11");
  expect("token past the vocabulary", idx, bin, p + ".bin: token ", {"model.vocab=50"});
  std::string bigger = rec;  // a tokenizer of 5000 ids against model.vocab 1000
  bigger.replace(bigger.find("\"vocab_size\": 1000"), 18, "\"vocab_size\": 5000");
  write_file(in.dir / "bigger.json", bigger);
  expect("vocab mismatch", idx, bin, p + ".json: the tokenizer", {}, in.dir / "bigger.json");
  expect("blend weight 0", idx, bin, "data.blend[1].weight = 0",
         {"data.blend=[{path: " + p + ", weight: 1}, {path: " + good + ", weight: 0}]"});
  expect("blend weights all zero", idx, bin, "data.blend[0].weight = 0",
         {"data.blend=[{path: " + p + ", weight: 0}, {path: " + good + ", weight: 0}]"});
  expect("blend of a missing source", idx, bin, (in.dir / "gone") + ".idx: cannot stat",
         {"data.blend=[{path: " + p + ", weight: 1}, {path: " + (in.dir / "gone") + ", weight: 1}]"});
}

TEST_CASE("blend 0.8/0.2: 200 steps of a tiny GPT; a SIGTERM stop and relaunch, and dp 2 x tp 2 draw the same samples") {
  const Inputs& in = inputs();
  for (const char* name : {"a", "b"})
    REQUIRE(prepare({"--tokenizer", in.dir / "tok.json", "--input", in.dir / (std::string(name) + ".jsonl"),
                     "--output", in.dir / (std::string("src_") + name), "--append-eod"},
                    in.dir / "src.log").first == 0);
  const std::string blend = "{format: indexed, blend: [{path: " + (in.dir / "src_a") + ", weight: 0.8}, {path: " +
                            (in.dir / "src_b") + ", weight: 0.2}]}";
  write_file(in.dir / "blend.yaml", spec_text(blend));
  auto run = [&](const std::string& name, std::vector<std::string> sets, std::vector<std::string> extra = {}) {
    TagGuard tag;
    std::vector<std::string> argv = {dtrain_bin(), "launch", in.dir / "blend.yaml", "--set", "log.dir=" + (in.dir / name),
                                     "--set", "checkpoint.dir=" + (in.dir / name) + "/ckpt", "--set",
                                     "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())};
    for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto [code, output] = run_command(argv, in.dir / (name + ".log"), 300, {tag.env(), "DTRAIN_NO_REBUILD=1"});
    INFO(output);
    REQUIRE(code == 0);
    return std::pair{parity::losses_by_step(in.dir / name + "/metrics.jsonl"), data_tokens(in.dir / name + "/metrics.jsonl")};
  };
  const auto [loss, tokens] = run("straight", {"checkpoint.every=100"});
  REQUIRE(tokens.size() == 200);
  const double a = double(tokens.at(200).at("src_a")), b = double(tokens.at(200).at("src_b"));
  MESSAGE("after 200 steps: src_a " << a << " tokens, src_b " << b << " (share " << b / (a + b) << ", 0.2 wanted)");
  CHECK(a + b == 200.0 * 4 * 16);
  CHECK(std::fabs(b / (a + b) - 0.2) < 0.01);
  // A SIGTERM while it trains: the workers finish the step, save it and
  // exit; the relaunch resumes there. Its steps equal the straight run's:
  // losses bitwise, data_tokens exactly (the blend's cursor resumed).
  const std::string term = in.dir / "term";
  {
    TagGuard tag;
    std::vector<std::string> argv = {dtrain_bin(), "launch", in.dir / "blend.yaml", "--set", "log.dir=" + term,
                                     "--set", "checkpoint.dir=" + term + "/ckpt", "--set", "cluster.grace_s=60",
                                     "--set", "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())};
    Child child(argv, in.dir / "term.log", {tag.env(), "DTRAIN_NO_REBUILD=1"});
    while (child.running() && !parity::losses_by_step(term + "/metrics.jsonl").count(20)) child.wait(0.01);
    child.signal(SIGTERM);
    REQUIRE(child.wait(60));
    INFO(child.output());
    CHECK(child.exit_code() == 128 + SIGTERM);
  }
  const std::string latest = read_latest(term + "/ckpt");
  const int stopped = std::atoi(latest.c_str() + 5);
  MESSAGE("SIGTERM once step 20 was logged: stopped and saved after step " << stopped);
  REQUIRE(stopped >= 20);
  REQUIRE(stopped < 200);  // else the run ended before the signal: nothing was tested
  REQUIRE(parity::losses_by_step(term + "/metrics.jsonl").size() == size_t(stopped));
  const auto [rloss, rtokens] = run("term", {});  // checkpoint.dir's latest: resumes after `stopped`
  REQUIRE(rloss.size() == 200);                   // 1..stopped, then the relaunch's stopped+1..200
  double worst = 0;
  for (const auto& [step, l] : rloss) worst = std::max(worst, std::fabs(l - loss.at(step)));
  MESSAGE("stopped by SIGTERM at " << stopped << ", relaunched: max |loss difference| over steps 1-200 " << worst
                                   << " (tolerance 0: bit-exact)");
  CHECK(worst == 0.0);
  for (const auto& [step, counts] : rtokens) CHECK(counts == tokens.at(step));
  CHECK(rtokens.size() == 200);
  // dp 2 x tp 2, 20 steps of the same global batch (2 ranks x micro_batch 2).
  const auto [ploss, ptokens] = run("dp2tp2", {"train.steps=20", "cluster.procs_per_node=4", "parallel.dp=2",
                                               "parallel.tp=2", "train.micro_batch=2"});
  // Negative control: the blend's weights swapped (other samples, same model).
  const std::string swapped = "{format: indexed, blend: [{path: " + (in.dir / "src_a") + ", weight: 0.2}, {path: " +
                              (in.dir / "src_b") + ", weight: 0.8}]}";
  const auto [closs, ctokens] = run("control", {"train.steps=20", "data=" + swapped});
  double layout = 0, control = 0;
  for (int step = 1; step <= 20; ++step) {
    layout = std::max(layout, std::fabs(ploss.at(step) - loss.at(step)) / loss.at(step));
    control = std::max(control, std::fabs(closs.at(step) - loss.at(step)) / loss.at(step));
    CHECK(ptokens.at(step) == tokens.at(step));
  }
  const double tol = 1e-4;
  MESSAGE("dp 2 x tp 2 vs dp 1: max loss rel diff " << layout << " (tolerance " << tol << "); swapped weights "
                                                    << control << " (" << control / tol << "x the tolerance)");
  CHECK(layout <= tol);
  CHECK(control >= 100 * tol);
}

// The Llama on data prepared with a tokenizer of ~32k entries (BPE trained
// here on data/corpus.txt; the corpus supports 31.5k of the 32000 asked) and a
// held-out validation set (every 20th paragraph): val_loss at step 40 below
// step 20's. Negative control: the same run at lr 1e-9 (val_loss flat).
TEST_CASE("llama on prepared data (32k BPE): val_loss falls") {
  const Inputs& in = inputs();
  auto [mrc, made] = run_command({python(), source_dir() + "/tests/support/data_prepare_ref.py", "make32k",
                                  source_dir() + "/data/corpus.txt", in.dir.path()},
                                 in.dir / "make32k.log", 300);
  INFO(made);
  REQUIRE(mrc == 0);
  for (const char* name : {"train", "valid"})
    REQUIRE(prepare({"--tokenizer", in.dir / "tok32k.json", "--input", in.dir / (std::string(name) + ".jsonl"),
                     "--output", in.dir / (std::string("l_") + name), "--append-eod"},
                    in.dir / "l_prepare.log").first == 0);
  const std::string record = read_file(in.dir / "l_train.json");
  const auto at = record.find("\"vocab_size\": ");
  REQUIRE(at != std::string::npos);
  const int vocab = std::atoi(record.c_str() + at + 14);
  MESSAGE("tokenizer: " << vocab << " entries");
  CHECK(vocab > 30000);
  write_file(in.dir / "llama.yaml",
             "job: {name: llama-prepared, seed: 3}\n"
             "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
             "model: {kind: llama, vocab: " + std::to_string(vocab) +
                 ", layers: 2, d_model: 32, heads: 4, kv_heads: 2, ffn_hidden: 64, seq_len: 32, dropout: 0.0}\n"
                 "train: {steps: 40, micro_batch: 8, lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 4, precision: fp32}\n"
                 "data: {format: indexed, path: " + (in.dir / "l_train") + ", valid: {path: " + (in.dir / "l_valid") +
                 ", every: 20, batches: 16}}\n"
                 "log: {every: 10}\n");
  auto val_losses = [&](const std::string& name, const std::string& lr) {
    TagGuard tag;
    auto [code, output] = run_command(
        {dtrain_bin(), "launch", in.dir / "llama.yaml", "--set", "log.dir=" + (in.dir / name), "--set",
         "checkpoint.dir=" + (in.dir / name) + "/ckpt", "--set", "train.lr=" + lr, "--set", "train.min_lr=" + lr,
         "--set", "cluster.rendezvous.endpoint=127.0.0.1:" + std::to_string(free_port())},
        in.dir / (name + ".log"), 300, {tag.env(), "DTRAIN_NO_REBUILD=1"});
    INFO(output);
    REQUIRE(code == 0);
    std::map<int, double> out;
    std::ifstream metrics(in.dir / name + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);)
      if (const auto v = line.find("\"val_loss\": "); v != std::string::npos)
        out[std::atoi(line.c_str() + line.find("\"step\": ") + 8)] = std::atof(line.c_str() + v + 12);
    return out;
  };
  const auto trained = val_losses("llama", "1.0e-2"), flat = val_losses("llama_flat", "1.0e-9");
  REQUIRE(trained.count(20) == 1);
  REQUIRE(trained.count(40) == 1);
  REQUIRE(flat.count(40) == 1);
  MESSAGE("val_loss: step 20 " << trained.at(20) << ", step 40 " << trained.at(40) << " (ln V = " << std::log(vocab)
                               << "); at lr 1e-9: " << flat.at(20) << ", " << flat.at(40));
  CHECK(trained.at(40) < trained.at(20) - 0.05);
  CHECK(trained.at(20) < std::log(vocab) - 1.0);
  CHECK(std::fabs(flat.at(40) - flat.at(20)) < 1e-3);  // the control: nothing learnt, nothing falls
}
