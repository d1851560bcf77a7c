// Hugging Face weights in and out, with the real `dtrain` and transformers
// (tests/hf/hf_models.py, the venv's Python, offline): random tiny Llama
// (fp32), Mixtral (fp16, sharded) and tied Llama (bf16) models are imported
// and exported again; transformers must load every export cleanly and its
// state dict must equal the original bit for bit (a perturbed export is the
// negative control); an import of an export equals the first import bit for
// bit. `dtrain eval` of an imported Llama and Mixtral equals transformers'
// loss on the same windows and its logits within 1e-5 (fp32); imported
// weights trained 10 steps at dp 2 x tp 2, pp 2 and ep 2 and exported give
// transformers the loss `dtrain eval` gives the checkpoint, within 1e-5, and
// import back bit for bit. Each bad input exits 2 naming the problem and
// writes nothing; at launch, train.init_from of another architecture exits 2
// before any worker.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "tests/support/child.h"
#include "tests/support/train_run.h"

namespace {

namespace fs = std::filesystem;
using dtrain::testing::TempDir;
using dtrain::testing::read_file;
using dtrain::testing::write_file;
using Json = nlohmann::json;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::pair<int, std::string> dtrain_cmd(const TempDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), dtrain::testing::dtrain_bin());
  return dtrain::testing::run_command(args, dir / "cmd.log", 120, {"DTRAIN_NO_REBUILD=1"});
}

std::pair<int, std::string> python(const TempDir& dir, std::vector<std::string> args) {
  REQUIRE_MESSAGE(!dtrain::testing::python().empty(), "no Python with torch (scripts/install-deps installs the venv)");
  args.insert(args.begin(), {dtrain::testing::python(), dtrain::testing::source_dir() + "/tests/hf/hf_models.py"});
  return dtrain::testing::run_command(args, dir / "python.log", 300, {"HF_HUB_OFFLINE=1"});
}

// The random models, made once per program: L (Llama fp32), M (Mixtral
// fp16 in three shards with their index), B (Llama bf16, tied embeddings).
const TempDir& models() {
  static TempDir dir;
  static bool made = false;
  if (!made) {
    auto [code, out] = python(dir, {"make", "llama", dir / "L", "mixtral", dir / "M", "--dtype", "fp16",
                                    "--shard-bytes", "200000", "llama", dir / "B", "--dtype", "bf16", "--tie"});
    INFO(out);
    REQUIRE(code == 0);
    REQUIRE(fs::exists(dir / "M/model.safetensors.index.json"));
    made = true;
  }
  return dir;
}

// Every path under root with its size, but the test's *.log: "nothing
// written" is this unchanged.
std::vector<std::string> listing(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.path().extension() != ".log")  // the test's own command logs
      out.push_back(e.path().string() + (e.is_regular_file() ? " " + std::to_string(e.file_size()) : ""));
  std::sort(out.begin(), out.end());
  return out;
}

// Rewrites dir/model.safetensors through `change` (name -> tensor list).
void rewrite(const std::string& file, const std::function<void(std::vector<dtrain::safetensors::TensorView>&,
                                                                std::vector<std::vector<uint8_t>>&)>& change) {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<dtrain::safetensors::TensorView> views;
  std::map<std::string, std::string> meta;
  {
    dtrain::safetensors::File f(file);
    meta = f.metadata();
    for (const auto& t : f.tensors()) {
      bytes.push_back(f.read(t.name));
      views.push_back({t.name, t.dtype, t.shape, nullptr});
    }
  }
  change(views, bytes);
  for (size_t i = 0; i < views.size(); ++i) views[i].data = bytes[i].data();
  fs::remove(file);
  dtrain::safetensors::write_file(file, views, meta);
}

}  // namespace

TEST_CASE("import-hf then export-hf gives the original tensors bit for bit; transformers loads them cleanly") {
  const TempDir& m = models();
  TempDir dir;
  struct Case {
    std::string name;
    std::vector<std::string> export_flags;
  };
  const std::vector<Case> cases = {{"L", {}},
                                   {"M", {"--max-shard-bytes", "150000"}},  // sharded like transformers past 5 GB
                                   {"B", {"--dtype", "bf16"}}};
  std::vector<std::string> pairs;
  for (const auto& c : cases) {
    auto [code, out] = dtrain_cmd(dir, {"ckpt", "import-hf", m / c.name, dir / ("ck" + c.name)});
    INFO(out);
    REQUIRE(code == 0);
    std::vector<std::string> args = {"ckpt", "export-hf", dir / ("ck" + c.name), dir / ("E" + c.name)};
    args.insert(args.end(), c.export_flags.begin(), c.export_flags.end());
    std::tie(code, out) = dtrain_cmd(dir, args);
    REQUIRE(code == 0);
    pairs.insert(pairs.end(), {m / c.name, dir / ("E" + c.name)});
  }
  CHECK(fs::exists(dir / "EM/model.safetensors.index.json"));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir / "EM"))
    shards += e.path().filename().string().rfind("model-0000", 0) == 0;
  CHECK(shards > 1);
  CHECK(read_file(dir / "EB/config.json").find("\"tie_word_embeddings\": true") != std::string::npos);

  // The negative control: one element of the export off by 1.0.
  fs::copy(dir / "EL", dir / "EX", fs::copy_options::recursive);
  rewrite(dir / "EX/model.safetensors", [](auto& views, auto& bytes) {
    for (size_t i = 0; i < views.size(); ++i)
      if (views[i].name == "model.layers.1.mlp.down_proj.weight") {
        float v;
        std::memcpy(&v, bytes[i].data() + 40, 4);
        v += 1.0f;
        std::memcpy(bytes[i].data() + 40, &v, 4);
      }
  });
  pairs.insert(pairs.end(), {m / "L", dir / "EX"});
  std::vector<std::string> args = {"compare"};
  args.insert(args.end(), pairs.begin(), pairs.end());
  auto [code, out] = python(dir, args);
  MESSAGE(out.substr(out.find("pair 0")));
  CHECK(code == 1);  // the control differs
  for (int i = 0; i < 3; ++i) {
    INFO("pair " << i << "\n" << out);
    CHECK(has(out, "pair " + std::to_string(i) + ": clean load; 0 differ, max abs diff 0.0"));
  }
  CHECK(has(out, "pair 3: clean load; 1 differ, max abs diff 1.0"));

  // import of an export equals the first import, bit for bit
  for (const std::string c : {"L", "M"}) {
    auto [code2, out2] = dtrain_cmd(dir, {"ckpt", "import-hf", dir / ("E" + c), dir / ("ck2" + c)});
    INFO(out2);
    REQUIRE(code2 == 0);
    CHECK(read_file(dir / ("ck" + c + "/step_0/rank_0.safetensors")) ==
          read_file(dir / ("ck2" + c + "/step_0/rank_0.safetensors")));
  }
}

TEST_CASE("import-hf refuses bad input with exit 2, naming it, and writes nothing") {
  const TempDir& m = models();
  TempDir dir;
  struct Bad {
    std::string name;
    std::function<void(const std::string&)> make;  // spoils a copy of L at the path
    std::string message;
  };
  const auto config = [](const std::string& key, Json value) {
    return [key, value](const std::string& d) {
      Json j = Json::parse(read_file(d + "/config.json"));
      if (value.is_discarded()) j.erase(key);
      else j[key] = value;
      write_file(d + "/config.json", j.dump());
    };
  };
  const auto tensor = [](const std::string& what, const std::string& name) {
    return [what, name](const std::string& d) {
      rewrite(d + "/model.safetensors", [&](auto& views, auto& bytes) {
        for (size_t i = 0; i < views.size(); ++i) {
          if (views[i].name != name) continue;
          if (what == "drop") {
            views.erase(views.begin() + long(i));
            bytes.erase(bytes.begin() + long(i));
          } else if (what == "shape") {
            views[i].shape[0] -= 1;
            bytes[i].resize(bytes[i].size() - size_t(views[i].shape[1]) * 4);
          } else {
            views[i].dtype = "I32";
          }
          return;
        }
      });
    };
  };
  const std::vector<Bad> cases = {
      {"no config.json", [](const std::string& d) { fs::remove(d + "/config.json"); }, "has no config.json"},
      {"architecture", config("architectures", Json::array({"GPT2LMHeadModel"})),
       "architecture GPT2LMHeadModel is not supported; dtrain imports LlamaForCausalLM, MixtralForCausalLM"},
      {"attention_bias", config("attention_bias", true), "\"attention_bias\": true is not supported"},
      {"mlp_bias", config("mlp_bias", true), "\"mlp_bias\": true is not supported"},
      {"sliding_window", config("sliding_window", 4096), "\"sliding_window\": 4096 is not supported"},
      {"head_dim", config("head_dim", 32), "\"head_dim\": 32 differs from hidden_size / num_attention_heads = 16"},
      {"rope type", config("rope_parameters", Json{{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1e4}}),
       "rope type \"yarn\" is not supported"},
      {"kv heads", config("num_key_value_heads", 3), "num_key_value_heads = 3 does not divide num_attention_heads = 4"},
      {"missing tensor", tensor("drop", "model.layers.1.self_attn.v_proj.weight"),
       "tensor model.layers.1.self_attn.v_proj.weight is missing"},
      {"shape", tensor("shape", "model.layers.0.mlp.up_proj.weight"),
       "model.safetensors: tensor model.layers.0.mlp.up_proj.weight has shape [95, 64]; config.json's model needs "
       "[96, 64]"},
      {"dtype", tensor("dtype", "model.norm.weight"),
       "model.safetensors: tensor model.norm.weight has dtype I32; expected F32, BF16 or F16"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const std::string hf = dir / ("bad_" + std::to_string(&c - cases.data()));
    fs::copy(m / "L", hf, fs::copy_options::recursive);
    c.make(hf);
    const auto before = listing(dir.path());
    auto [code, out] = dtrain_cmd(dir, {"ckpt", "import-hf", hf, dir / "out", "--spec-out", dir / "out.yaml"});
    INFO(out);
    CHECK(code == 2);
    CHECK(has(out, c.message));
    CHECK(listing(dir.path()) == before);  // no OUT_DIR, no spec, no temporary
  }
}

TEST_CASE("export-hf and import-hf refuse to write over anything") {
  const TempDir& m = models();
  TempDir dir;
  REQUIRE(dtrain_cmd(dir, {"ckpt", "import-hf", m / "L", dir / "ck"}).first == 0);
  fs::create_directory(dir / "taken");
  write_file(dir / "taken/keep.txt", "mine");
  const auto before = listing(dir.path());
  auto [code, out] = dtrain_cmd(dir, {"ckpt", "export-hf", dir / "ck", dir / "taken"});
  CHECK(code == 2);
  CHECK(has(out, "OUT_DIR = " + dir / "taken" + " already exists"));
  std::tie(code, out) = dtrain_cmd(dir, {"ckpt", "export-hf", dir / "ck", dir / "ck/step_0/hf"});
  CHECK(code == 2);
  CHECK(has(out, "is inside the checkpoint being read"));
  std::tie(code, out) = dtrain_cmd(dir, {"ckpt", "import-hf", m / "L", dir / "taken"});
  CHECK(code == 2);
  CHECK(has(out, "OUT_DIR = " + dir / "taken" + " already exists and is not empty"));
  CHECK(listing(dir.path()) == before);
}

TEST_CASE("train.init_from of another architecture exits 2 at launch, naming the difference") {
  const TempDir& m = models();
  TempDir dir;
  REQUIRE(dtrain_cmd(dir, {"ckpt", "import-hf", m / "L", dir / "ck", "--spec-out", dir / "spec.yaml"}).first == 0);
  write_file(dir / "text.txt", dtrain::testing::word_salad(4096, {"a ", "b\n"}));
  const std::vector<std::string> common = {
      "--set", "data.path=" + dir / "text.txt", "--set", "log.dir=" + dir / "run", "--set",
      "cluster.device=cpu", "--set", "cluster.procs_per_node=1",
      // the launcher's part alone (the engine's llama is not needed): a
      // worker that reports the checkpoint it was told to load
      "--set", "entrypoint=[sh, -c, 'echo \"$DTRAIN_INIT_FROM\" > " + dir / "told" + "']"};
  {  // the same architecture: imported into log.dir/init_from, handed to the workers
    std::vector<std::string> args = {"launch", dir / "spec.yaml", "--set", "train.init_from=" + m / "L"};
    args.insert(args.end(), common.begin(), common.end());
    auto [code, out] = dtrain_cmd(dir, args);
    INFO(out);
    REQUIRE(code == 0);
    CHECK(read_file(dir / "told") == dir / "run/init_from/step_0\n");
    CHECK(has(read_file(dir / "run/init_from/step_0/index.json"), "\"weights_only\": true"));
    CHECK(read_file(dir / "run/init_from/step_0/rank_0.safetensors") == read_file(dir / "ck/step_0/rank_0.safetensors"));
  }
  std::vector<std::string> other = common;
  other.insert(other.end(), {"--set", "model.d_model=32", "--set", "log.dir=" + dir / "run2"});
  for (const auto& [from, message] : std::vector<std::pair<std::string, std::string>>{
           {m / "L", "another architecture: model.d_model = 32 in this run's spec, 64 in " + m / "L/config.json"},
           {dir / "ck", "tensor model/wte.weight: this run's model needs [256, 32], " + dir / "ck/step_0" +
                            " has [256, 64]"}}) {
    std::vector<std::string> args = {"launch", dir / "spec.yaml", "--set", "train.init_from=" + from};
    args.insert(args.end(), other.begin(), other.end());
    auto [code, out] = dtrain_cmd(dir, args);
    INFO(out);
    CHECK(code == 2);
    CHECK(has(out, "train.init_from = " + from + ": "));
    CHECK(has(out, message));
    CHECK(!fs::exists(dir / "run2"));  // refused before anything was made
  }
}

namespace {
// The largest |a - b| over the tensors both hold.
double max_diff(const std::map<std::string, std::vector<float>>& a, const std::map<std::string, std::vector<float>>& b) {
  double worst = 0;
  for (const auto& [name, va] : a) {
    const auto it = b.find(name);
    REQUIRE(it != b.end());
    REQUIRE(it->second.size() == va.size());
    for (size_t i = 0; i < va.size(); ++i) worst = std::max(worst, double(std::fabs(va[i] - it->second[i])));
  }
  return worst;
}
}  // namespace

TEST_CASE("train.init_from loads the weights only: step 0, fresh optimizer and sampler, at another mesh") {
  TempDir dir;
  write_file(dir / "text.txt", dtrain::testing::word_salad(8 * 1024, {"init ", "from\n"}));
  write_file(dir / "spec.yaml",
             "job: {name: initfrom, seed: 5}\n"
             "cluster: {nodes: 1, procs_per_node: 1, device: cpu, backend: gloo}\n"
             "model: {kind: gpt, vocab: 256, layers: 1, d_model: 16, heads: 2, seq_len: 16}\n"
             "train: {steps: 2, micro_batch: 2, lr: 1.0e-2, warmup_steps: 1}\n"
             "data: {path: " + dir / "text.txt" + ", format: bytes}\n"
             "log: {dir: " + dir / "run" + ", every: 1}\n");
  const auto launch = [&](const std::string& name, std::vector<std::string> sets) {
    std::vector<std::string> args = {"launch", dir / "spec.yaml", "--set", "checkpoint.dir=" + dir / name,
                                     "--set", "log.dir=" + dir / ("run_" + name)};
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    dtrain::testing::TagGuard tag;
    args.insert(args.begin(), dtrain::testing::dtrain_bin());
    auto [code, out] = dtrain::testing::run_command(args, dir / (name + ".log"), 120, {tag.env(), "DTRAIN_NO_REBUILD=1"});
    INFO(out);
    REQUIRE(code == 0);
    return out;
  };
  launch("A", {});  // trained 2 steps at lr 1e-2: far from any initialisation
  // B starts from A's weights on 2 ranks (another mesh), 1 step at a learning
  // rate too small to move them; C is B without init_from (the control).
  const std::vector<std::string> tiny = {"train.steps=1", "train.lr=1.0e-9", "train.min_lr=0",
                                         "cluster.procs_per_node=2", "parallel.dp=2"};
  std::vector<std::string> b = tiny;
  b.push_back("train.init_from=" + dir / "A");
  const std::string out_b = launch("B", b);
  launch("C", tiny);
  CHECK(has(out_b, "initialised the model from " + dir / "A/step_2"));
  const auto a = dtrain::testing::read_checkpoint_params(dir / "A", dir.path());
  const double from_init = max_diff(a, dtrain::testing::read_checkpoint_params(dir / "B", dir.path()));
  const double control = max_diff(a, dtrain::testing::read_checkpoint_params(dir / "C", dir.path()));
  MESSAGE("init_from: max |A - B| = " << from_init << " (tolerance 1e-6); control without init_from: " << control);
  CHECK(from_init < 1e-6);
  CHECK(control > 1e-4);
  const Json index = Json::parse(read_file(dir / "B/step_1/index.json"));
  CHECK(index["optimizer"]["step_count"] == 1);  // fresh AdamW, not A's 2 steps + 1
  CHECK(index["sampler"]["consumed"] == Json::parse(read_file(dir / "C/step_1/index.json"))["sampler"]["consumed"]);
}

namespace {
constexpr double kTol = 1e-5;  // fp32 parity with transformers
constexpr int kT = 32, kWindows = 4;

// Word salad of 8 KiB: the corpus both dtrain and transformers cut windows from.
std::string salad_corpus(const TempDir& dir) {
  write_file(dir / "text.txt", dtrain::testing::word_salad(8 * 1024, {"Llama ", "weights ", "go ", "in ", "and ",
                                                                       "out, ", "checked ", "against ", "transformers.\n"}));
  return dir / "text.txt";
}

// The settings every run on the corpus shares: windows of kT tokens, 2 rows
// a micro-batch, the CPU, logs under dir/log_<name>.
std::vector<std::string> corpus_sets(const TempDir& dir, const std::string& name) {
  return {"data.path=" + dir / "text.txt", "log.dir=" + dir / ("log_" + name), "cluster.device=cpu",
          "model.seq_len=" + std::to_string(kT), "train.micro_batch=2", "model.dropout=0"};
}

// `dtrain eval SPEC --ckpt CKPT --batches kWindows --format json` (plus
// `extra`) at one process: the loss it prints.
double dtrain_eval(const TempDir& dir, const std::string& name, const std::string& spec, const std::string& ckpt,
                   std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>'" + dir / (name + ".stderr") + "'",
                                   dtrain::testing::dtrain_bin(), "eval", spec, "--ckpt", ckpt, "--batches",
                                   std::to_string(kWindows), "--format", "json"};
  for (const auto& s : corpus_sets(dir, name)) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), extra.begin(), extra.end());
  dtrain::testing::TagGuard tag;
  auto [code, out] = dtrain::testing::run_command(args, dir / (name + ".log"), 120, {tag.env(), "DTRAIN_NO_REBUILD=1"});
  INFO(name << " stdout: " << out << "\nstderr:\n" << read_file(dir / (name + ".stderr")));
  REQUIRE(code == 0);
  const Json j = Json::parse(out);
  CHECK(j["tokens"].get<int>() == kWindows * kT);
  return j["loss"].get<double>();
}

// The number after `key ` in the line of `text` that starts with `line`.
double figure(const std::string& text, const std::string& line, const std::string& key) {
  const size_t at = text.find(line);
  REQUIRE_MESSAGE(at != std::string::npos, "no line " << line << " in:\n" << text);
  const std::string rest = text.substr(at, text.find('\n', at) - at);
  const size_t k = rest.find(" " + key + " ");
  REQUIRE_MESSAGE(k != std::string::npos, "no " << key << " in: " << rest);
  return std::stod(rest.substr(k + key.size() + 2));
}
}  // namespace

TEST_CASE("dtrain eval of an imported Llama and Mixtral equals transformers' loss and logits") {
  const TempDir& m = models();
  TempDir dir;
  const std::string corpus = salad_corpus(dir);
  std::map<std::string, double> mine;
  std::vector<std::string> args = {"windows", std::to_string(kT), std::to_string(kWindows), corpus};
  for (const std::string c : {"L", "M"}) {  // Mixtral: import-hf's capacity drops no token, as transformers
    CAPTURE(c);
    auto [code, out] = dtrain_cmd(dir, {"ckpt", "import-hf", m / c, dir / ("ck" + c), "--spec-out",
                                        dir / (c + ".yaml"), "--set", "model.seq_len=" + std::to_string(kT)});
    INFO(out);
    REQUIRE(code == 0);
    mine[c] = dtrain_eval(dir, "eval" + c, dir / (c + ".yaml"), dir / ("ck" + c), {"--logits-out", dir / (c + ".npy")});
    args.insert(args.end(), {m / c, "--logits", dir / (c + ".npy")});
  }
  auto [code, out] = python(dir, args);
  INFO(out);
  REQUIRE(code == 0);
  for (const std::string c : {"L", "M"}) {
    const std::string at = "windows " + m / c + " ", lat = "logits " + m / c + " ";
    const double hf = figure(out, at, "loss"), shifted = figure(out, at, "shifted");
    const double logits = figure(out, lat, "diff"), other = figure(out, lat, "window 1");
    MESSAGE(c << ": loss dtrain " << mine[c] << ", transformers " << hf << ": |diff| " << std::fabs(mine[c] - hf)
              << " (tolerance " << kTol << "); control (windows one byte later) " << std::fabs(mine[c] - shifted));
    MESSAGE(c << ": logits of window 0: max |diff| " << logits << " (tolerance " << kTol
              << "); control (transformers' window 1) " << other);
    CHECK(std::fabs(mine[c] - hf) <= kTol);
    CHECK(std::fabs(mine[c] - shifted) >= 100 * kTol);
    CHECK(logits <= kTol);
    CHECK(other >= 100 * kTol);
  }
  // --logits-out is for one-rank meshes: a larger one exits 2 before any worker.
  std::tie(code, out) = dtrain_cmd(dir, {"eval", dir / "L.yaml", "--ckpt", dir / "ckL", "--logits-out", dir / "x.npy",
                                      "--set", "parallel.dp=2", "--set", "cluster.procs_per_node=2", "--set",
                                      "data.path=" + corpus});
  CHECK(code == 2);
  CHECK(has(out, "--logits-out needs a one-rank mesh; parallel.dp (2) x tp (1) x pp (1) x cp (1) = 2"));
  CHECK(!fs::exists(dir / "x.npy"));
}

TEST_CASE("imported weights train 10 steps at dp 2 x tp 2, pp 2 and Mixtral at ep 2; transformers agrees with "
          "dtrain eval on the export") {
  const TempDir& m = models();
  TempDir dir;
  const std::string corpus = salad_corpus(dir);
  struct Layout {
    std::string name, model;
    std::vector<std::string> sets;
  };
  const std::vector<Layout> layouts = {
      {"dp2tp2", "L", {"parallel.dp=2", "parallel.tp=2", "cluster.procs_per_node=4"}},
      {"pp2", "L", {"parallel.dp=1", "parallel.pp=2", "cluster.procs_per_node=2", "train.grad_accum=2"}},
      {"ep2", "M", {"parallel.dp=2", "parallel.ep=2", "cluster.procs_per_node=2"}}};
  std::vector<std::string> windows_args = {"windows", std::to_string(kT), std::to_string(kWindows), corpus};
  std::map<std::string, double> evaluated;
  for (const auto& l : layouts) {
    CAPTURE(l.name);
    // The spec import-hf writes for the model; the run starts from the HF
    // directory itself (train.init_from) and trains 10 steps at lr 1e-3.
    auto [code, out] = dtrain_cmd(dir, {"ckpt", "import-hf", m / l.model, dir / ("imp_" + l.name), "--spec-out",
                                        dir / (l.name + ".yaml")});
    REQUIRE(code == 0);
    std::vector<std::string> args = {dtrain::testing::dtrain_bin(), "launch", dir / (l.name + ".yaml")};
    std::vector<std::string> sets = corpus_sets(dir, "train_" + l.name);
    sets.insert(sets.end(), {"train.init_from=" + m / l.model, "checkpoint.dir=" + dir / ("ck_" + l.name),
                             "train.steps=10", "train.lr=1.0e-3", "train.warmup_steps=0", "log.every=5"});
    sets.insert(sets.end(), l.sets.begin(), l.sets.end());
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    dtrain::testing::TagGuard tag;
    std::tie(code, out) = dtrain::testing::run_command(args, dir / (l.name + ".log"), 180, {tag.env(), "DTRAIN_NO_REBUILD=1"});
    INFO(out);
    REQUIRE(code == 0);
    std::tie(code, out) = dtrain_cmd(dir, {"ckpt", "export-hf", dir / ("ck_" + l.name), dir / ("E_" + l.name)});
    REQUIRE(code == 0);
    // dtrain eval of the final checkpoint, at one process
    evaluated[l.name] = dtrain_eval(dir, "eval_" + l.name, dir / (l.name + ".yaml"), dir / ("ck_" + l.name));
    windows_args.push_back(dir / ("E_" + l.name));
    // import of the export equals the checkpoint bit for bit
    std::tie(code, out) = dtrain_cmd(dir, {"ckpt", "import-hf", dir / ("E_" + l.name), dir / ("re_" + l.name)});
    REQUIRE(code == 0);
    const auto trained = dtrain::testing::read_checkpoint_params(dir / ("ck_" + l.name), dir.path());
    const double reimport = max_diff(dtrain::testing::read_checkpoint_params(dir / ("re_" + l.name), dir.path()), trained);
    const double moved = max_diff(dtrain::testing::read_checkpoint_params(dir / ("imp_" + l.name), dir.path()), trained);
    MESSAGE(l.name << ": import of the export vs the checkpoint: max |diff| " << reimport
                   << " (required 0); control (the weights before training) " << moved);
    CHECK(reimport == 0);
    CHECK(moved >= 1e-4);
  }
  // transformers' loss on each export (and, the control, on the models before training)
  windows_args.insert(windows_args.end(), {m / "L", m / "M"});
  auto [code, out] = python(dir, windows_args);
  INFO(out);
  REQUIRE(code == 0);
  for (const auto& l : layouts) {
    const double hf = figure(out, "windows " + dir / ("E_" + l.name) + " ", "loss");
    const double before = figure(out, "windows " + m / l.model + " ", "loss");
    const double mine = evaluated[l.name];
    MESSAGE(l.name << ": dtrain eval " << mine << ", transformers on the export " << hf << ": |diff| "
                   << std::fabs(mine - hf) << " (tolerance " << kTol << "); control (before training) "
                   << std::fabs(mine - before));
    CHECK(std::fabs(mine - hf) <= kTol);
    CHECK(std::fabs(mine - before) >= 100 * kTol);
  }
}
