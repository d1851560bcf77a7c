// Hugging Face weights in and out of dtrain checkpoints (docs/ARCHITECTURE.md,
// 'Hugging Face weights'): import reads config.json and model.safetensors (or
// its sharded index) of a Llama / Mixtral and writes a weights-only step_0;
// export writes config.json and model.safetensors (sharded past a size) from
// any checkpoint of model.kind llama. Tensors stream one at a time (memory
// map, converted in chunks), so memory stays far below the model's size.
// Names and shapes are hf_llama.h; no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace dtrain::hf {

// The job spec an import writes and checks against: built-in defaults with
// the model section from HF_DIR/config.json, then `sets` ("path=value", as
// --set) applied, validated. Throws dtrain::Error(config) naming the file.
JobSpec import_spec(const std::string& hf_dir, const std::vector<std::string>& sets);

// Throws dtrain::Error(config) naming the first field of `m` (a run's model
// section) that differs from the architecture of HF_DIR/config.json.
void check_model_matches(const std::string& hf_dir, const ModelSpec& m);

// Throws dtrain::Error(config) unless `out_dir` may receive an import: it
// does not exist, or is an empty directory (not a link).
void check_import_target(const std::string& out_dir, const std::string& field);

struct ImportStats {
  int tensors = 0;          // dtrain parameters written
  uint64_t bytes = 0;       // fp32 bytes written
  std::string step_dir;     // <out_dir>/step_0
};
// Checks every tensor HF_DIR should hold for spec.model (present, its shape,
// dtype F32/BF16/F16) before writing anything, then writes out_dir/step_0
// (weights only, fp32, one rank file) and out_dir/latest. Bad input throws
// dtrain::Error(config) naming the file and tensor; whatever fails, nothing
// of out_dir that this call created is left behind.
ImportStats import_checkpoint(const std::string& hf_dir, const JobSpec& spec, const std::string& out_dir);

struct ExportOptions {
  std::string dtype = "fp32";                   // fp32 | bf16
  uint64_t max_shard_bytes = 5000000000ULL;     // transformers' default "5GB"
};
struct ExportStats {
  int tensors = 0;  // HF tensors written
  int files = 0;    // safetensors files
  uint64_t bytes = 0;
};
// Writes out_dir (which must not exist; it appears whole, by rename, or not
// at all) from checkpoint `path` (a step dir, a run's checkpoint dir or its
// latest file), whatever mesh it was saved at.
ExportStats export_checkpoint(const std::string& path, const std::string& out_dir, const ExportOptions& options);

}  // namespace dtrain::hf
