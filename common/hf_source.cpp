// HfSource and the dtype conversions (hf_source.h).
#include "common/hf_source.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/checkpoint_index.h"
#include "common/error.h"

namespace dtrain::hf {
namespace fs = std::filesystem;

namespace {
constexpr uint64_t kMaxJsonBytes = uint64_t(64) << 20;

[[noreturn]] void bad_input(const std::string& msg, const std::string& hint = {}) {
  throw Error(ErrorCode::config, msg, hint);
}

// A damaged file is bad input to an import: exit 2, like the other refusals.
std::string read_json_file(const std::string& path, const std::string& what) {
  try {
    return safetensors::read_regular(path, what, kMaxJsonBytes);
  } catch (const Error& e) {
    bad_input(e.message(), e.hint());
  }
}
}  // namespace

std::string read_config(const std::string& hf_dir) {
  const std::string path = hf_dir + "/config.json";
  std::error_code ec;
  if (!fs::exists(path, ec))
    bad_input(hf_dir + " has no config.json; it is not a Hugging Face model directory",
              "give the directory save_pretrained wrote (config.json and model.safetensors)");
  return read_json_file(path, "config.json");
}

HfSource::HfSource(const std::string& hf_dir) : dir_(hf_dir) {
  const std::string single = hf_dir + "/model.safetensors", index = single + ".index.json";
  std::error_code ec;
  std::vector<std::string> names;
  std::map<std::string, std::string> weight_map;
  if (fs::exists(single, ec)) {
    names.push_back("model.safetensors");
  } else if (fs::exists(index, ec)) {
    try {
      const auto j = nlohmann::json::parse(read_json_file(index, "model.safetensors.index.json"));
      weight_map = j.at("weight_map").get<std::map<std::string, std::string>>();
    } catch (const nlohmann::json::exception& e) {
      bad_input(index + ": not a safetensors index (" + e.what() + ")");
    }
    for (const auto& [tensor, file] : weight_map) {
      if (!checkpoint::is_plain_file_name(file))
        bad_input(index + ": tensor " + tensor + " is in \"" + file + "\", not a file of " + hf_dir);
      if (std::find(names.begin(), names.end(), file) == names.end()) names.push_back(file);
    }
  } else {
    bad_input(hf_dir + " has neither model.safetensors nor model.safetensors.index.json",
              "dtrain imports safetensors weights (save_pretrained writes them by default)");
  }
  for (const auto& name : names) {
    try {
      files_.push_back(std::make_unique<safetensors::File>(hf_dir + "/" + name, /*follow_links=*/true));
    } catch (const Error& e) {
      bad_input(e.message(), e.hint());
    }
    for (const auto& t : files_.back()->tensors()) tensors_[t.name] = {files_.back().get(), t};
  }
  for (const auto& [tensor, file] : weight_map) {
    const auto it = tensors_.find(tensor);
    if (it == tensors_.end() || fs::path(it->second.file->path()).filename() != file)
      bad_input(index + " maps tensor " + tensor + " to " + file + ", which does not hold it");
  }
}

void HfSource::check(const std::vector<LlamaParam>& params, bool tied) const {
  std::vector<std::string> problems;
  std::set<std::string> used;
  for (const auto& p : params)
    for (const auto& piece : p.pieces) {
      used.insert(piece.name);
      const auto it = tensors_.find(piece.name);
      if (it == tensors_.end()) {
        problems.push_back("tensor " + piece.name + " is missing from " + dir_ + " (dtrain's " + p.name + " needs it)");
        continue;
      }
      const auto& [file, info] = it->second;
      if (info.dtype != "F32" && info.dtype != "BF16" && info.dtype != "F16")
        problems.push_back(file->path() + ": tensor " + piece.name + " has dtype " + info.dtype +
                           "; expected F32, BF16 or F16");
      else if (info.shape != piece.shape)
        problems.push_back(file->path() + ": tensor " + piece.name + " has shape " +
                           safetensors::shape_text(info.shape) + "; config.json's model needs " +
                           safetensors::shape_text(piece.shape));
    }
  for (const auto& [name, t] : tensors_) {
    const bool ignored = name.find("rotary_emb.inv_freq") != std::string::npos || (tied && name == "lm_head.weight");
    if (!used.count(name) && !ignored)
      problems.push_back(t.file->path() + ": tensor " + name + " is not part of the model config.json describes");
  }
  if (problems.empty()) return;
  std::string msg = dir_ + ": the weights do not match config.json:";
  for (size_t i = 0; i < problems.size() && i < 12; ++i) msg += "\n  " + problems[i];
  if (problems.size() > 12) msg += "\n  ... and " + std::to_string(problems.size() - 12) + " more";
  bad_input(msg, "import the directory save_pretrained wrote for this config, unchanged");
}

const SourceTensor& HfSource::at(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error(ErrorCode::internal, "HfSource: no tensor " + name + " (check() first)");
  return it->second;
}

namespace {
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf, NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);  // rebias 15 -> 127
  } else if (man == 0) {
    bits = sign;  // +-0
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = man;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400) == 0);
    bits = sign | (uint32_t(112 - e) << 23) | ((m & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
}  // namespace

void to_fp32(const std::string& dtype, const void* src, float* dst, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  if (dtype == "F32") {
    std::memcpy(dst, s, n * 4);
  } else if (dtype == "BF16") {
    for (size_t i = 0; i < n; ++i) {
      const uint32_t bits = uint32_t(s[2 * i] | (s[2 * i + 1] << 8)) << 16;
      std::memcpy(dst + i, &bits, 4);
    }
  } else if (dtype == "F16") {
    for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(uint16_t(s[2 * i] | (s[2 * i + 1] << 8)));
  } else {
    throw Error(ErrorCode::internal, "to_fp32: dtype " + dtype);
  }
}

void to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
      dst[i] = uint16_t((u >> 16) | 0x0040);  // NaN: quiet, sign kept
      continue;
    }
    u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even
    dst[i] = uint16_t(u >> 16);
  }
}

}  // namespace dtrain::hf
