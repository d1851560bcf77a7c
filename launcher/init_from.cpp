// check_init_from and prepare_init_from (init_from.h).
#include "launcher/init_from.h"

#include <filesystem>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_reader.h"
#include "common/error.h"
#include "common/hf_io.h"
#include "common/hf_llama.h"
#include "common/log.h"

namespace dtrain::launcher {
namespace fs = std::filesystem;
namespace {

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

[[noreturn]] void refuse(const std::string& path, const std::string& what, const std::string& hint) {
  throw Error(ErrorCode::config, "train.init_from = " + path + ": " + what, hint);
}

// A dtrain checkpoint: its stored model section first (a gpt's tensors are
// the engine's to list), then, for llama, every tensor by name and shape.
void check_checkpoint(const JobSpec& spec, const std::string& path) {
  std::string dir;
  try {
    dir = checkpoint::resolve(path);
  } catch (const Error& e) {
    refuse(path, "neither a Hugging Face model directory (no config.json) nor a dtrain checkpoint (" +
                     e.message() + ")",
           "give a directory save_pretrained wrote, a step_<N> dir, or a run's checkpoint.dir");
  }
  const checkpoint::CheckpointReader reader(dir);
  const std::string hint = "initialise from a checkpoint of this model, or set the model section to its own";
  if (reader.index().weights_only || spec.model.kind == "llama") {
    if (spec.model.kind != "llama")
      refuse(path, "a weights-only (imported) checkpoint initialises model.kind llama, not " + spec.model.kind, hint);
    for (const auto& p : hf::llama_params(spec.model)) {
      const checkpoint::TensorEntry* t = reader.index().find("model/" + p.name);
      if (!t) refuse(path, "tensor model/" + p.name + " " + safetensors::shape_text(p.shape) +
                               " of this run's model is not in " + dir, hint);
      if (t->shape != p.shape)
        refuse(path, "tensor model/" + p.name + ": this run's model needs " + safetensors::shape_text(p.shape) +
                         ", " + dir + " has " + safetensors::shape_text(t->shape), hint);
    }
    return;
  }
  const JobSpec theirs = parse_job_spec(reader.index().spec_yaml, dir + "/index.json");
  const std::string diff = hf::architecture_difference(spec.model, theirs.model, "in this run's spec", "in " + dir);
  if (!diff.empty()) refuse(path, "another architecture: " + diff, hint);
}

}  // namespace

void check_init_from(const JobSpec& spec) {
  const std::string& path = spec.train.init_from;
  if (path.empty()) return;
  std::error_code ec;
  if (!fs::exists(path, ec))
    refuse(path, "no such file or directory", "give a Hugging Face model directory or a dtrain checkpoint");
  if (!is_hf_dir(path)) return check_checkpoint(spec, path);
  if (spec.model.kind != "llama")
    refuse(path, "a Hugging Face model initialises model.kind llama, not " + spec.model.kind,
           "set model.kind: llama and the model's sizes (dtrain ckpt import-hf --spec-out writes them)");
  hf::check_model_matches(path, spec.model);
}

std::string prepare_init_from(const JobSpec& spec, const std::string& run_dir) {
  const std::string& path = spec.train.init_from;
  if (!is_hf_dir(path)) return fs::absolute(checkpoint::resolve(path)).string();
  const std::string out = run_dir + "/init_from";
  std::error_code ec;
  fs::remove_all(out, ec);  // an earlier launch's import: this one is made afresh
  const hf::ImportStats st = hf::import_checkpoint(path, spec, out);
  DTRAIN_INFO("train.init_from = {}: imported {} tensors ({:.1f} MB) into {}", path, st.tensors,
              double(st.bytes) / 1e6, st.step_dir);
  return fs::absolute(st.step_dir).string();
}

}  // namespace dtrain::launcher
