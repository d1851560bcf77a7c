// index.json and the per-file shard lists (checkpoint_index.h) to and from
// JSON. Checksums are written as 8 hex digits so they are greppable.
#include "common/checkpoint_index.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dtrain::checkpoint {
namespace {

using Json = nlohmann::ordered_json;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

Json entry_to_json(const TensorEntry& t) {
  Json shards = Json::array();
  for (const auto& s : t.shards) {
    Json slice = Json::array();
    for (auto& r : s.slice) slice.push_back({r.first, r.second});
    shards.push_back({{"file", s.file}, {"key", s.key}, {"slice", slice}, {"crc32c", hex32(s.crc32c)}});
  }
  return {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"shards", shards}};
}

TensorEntry entry_from_json(const Json& j) {
  TensorEntry t;
  t.name = j.at("name").get<std::string>();
  t.dtype = j.at("dtype").get<std::string>();
  t.shape = j.at("shape").get<std::vector<int64_t>>();
  for (const auto& s : j.at("shards")) {
    Shard sh;
    sh.file = s.at("file").get<std::string>();
    sh.key = s.at("key").get<std::string>();
    for (const auto& r : s.at("slice")) sh.slice.emplace_back(r.at(0).get<int64_t>(), r.at(1).get<int64_t>());
    sh.crc32c = uint32_t(std::stoul(s.at("crc32c").get<std::string>(), nullptr, 16));
    if (sh.slice.size() != t.shape.size())
      throw Error(ErrorCode::checkpoint, "tensor " + t.name + ": shard in " + sh.file + " has slice " +
                                             slice_to_string(sh.slice) + " for shape " +
                                             shape_to_string(t.shape));
    t.shards.push_back(std::move(sh));
  }
  return t;
}

}  // namespace

const TensorEntry* Index::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string shape_to_string(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

std::string slice_to_string(const std::vector<Range>& slice) {
  std::string t = "[";
  for (size_t i = 0; i < slice.size(); ++i)
    t += (i ? ", " : "") + std::to_string(slice[i].first) + ":" + std::to_string(slice[i].second);
  return t + "]";
}

std::string index_to_json(const Index& x) {
  Json tensors = Json::array();
  for (const auto& t : x.tensors) tensors.push_back(entry_to_json(t));
  Json j = {{"format", "dtrain-checkpoint"},
            {"version", x.version},
            {"step", x.step},
            {"mesh", x.mesh},
            {"world", x.world},
            {"model", x.model},
            {"sampler", {{"consumed", x.sampler_consumed}}},
            {"optimizer", {{"step_count", x.optimizer_step}}},
            {"schedule",
             {{"step", x.step}, {"lr", x.schedule.lr}, {"min_lr", x.schedule.min_lr},
              {"warmup_steps", x.schedule.warmup_steps}, {"total_steps", x.schedule.total_steps}}},
            {"files", x.files},
            {"tensors", tensors},
            {"spec", x.spec_yaml}};
  if (x.weights_only) j["weights_only"] = true;  // absent in a training checkpoint
  return j.dump(1) + "\n";
}

Index index_from_json(const std::string& text, const std::string& source) {
  Index x;
  try {
    Json j = Json::parse(text);
    if (j.value("format", "") != "dtrain-checkpoint")
      throw Error(ErrorCode::checkpoint, source + " is not a dtrain checkpoint index (no \"format\": \"dtrain-checkpoint\")");
    x.version = j.at("version").get<int>();
    if (x.version != kIndexVersion)
      throw Error(ErrorCode::checkpoint, source + ": index version " + std::to_string(x.version) +
                                             " is not supported (this dtrain reads version " +
                                             std::to_string(kIndexVersion) + ")");
    x.step = j.at("step").get<int64_t>();
    x.mesh = j.at("mesh").get<std::string>();
    x.world = j.at("world").get<int>();
    x.model = j.at("model").get<std::string>();
    x.sampler_consumed = j.at("sampler").at("consumed").get<int64_t>();
    x.optimizer_step = j.at("optimizer").at("step_count").get<int64_t>();
    x.weights_only = j.value("weights_only", false);
    const Json& s = j.at("schedule");
    x.schedule.lr = s.at("lr").get<double>();
    x.schedule.min_lr = s.at("min_lr").get<double>();
    x.schedule.warmup_steps = s.at("warmup_steps").get<int64_t>();
    x.schedule.total_steps = s.at("total_steps").get<int64_t>();
    x.files = j.at("files").get<std::vector<std::string>>();
    for (const auto& t : j.at("tensors")) x.tensors.push_back(entry_from_json(t));
    x.spec_yaml = j.at("spec").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::checkpoint, source + ": bad index: " + e.what(),
                "the index is damaged; use another checkpoint");
  } catch (const std::invalid_argument&) {
    throw Error(ErrorCode::checkpoint, source + ": bad index: a crc32c is not hex");
  } catch (const std::out_of_range&) {
    throw Error(ErrorCode::checkpoint, source + ": bad index: a crc32c is out of range");
  }
  check_index(x, source);
  return x;
}

std::string shards_to_metadata(const std::vector<TensorEntry>& entries) {
  Json a = Json::array();
  for (const auto& t : entries) a.push_back(entry_to_json(t));
  return a.dump();
}

std::vector<TensorEntry> shards_from_metadata(const std::string& text, const std::string& source) {
  std::vector<TensorEntry> out;
  try {
    for (const auto& t : Json::parse(text)) out.push_back(entry_from_json(t));
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::checkpoint, source + ": bad " + kShardsMetadataKey + " metadata: " + e.what());
  }
  return out;
}

void add_shards(Index& index, const std::vector<TensorEntry>& from_one_file) {
  for (const auto& t : from_one_file) {
    TensorEntry* have = nullptr;
    for (auto& e : index.tensors)
      if (e.name == t.name) have = &e;
    if (!have) {
      index.tensors.push_back(t);
      continue;
    }
    if (have->shape != t.shape || have->dtype != t.dtype)
      throw Error(ErrorCode::checkpoint, "tensor " + t.name + " is " + t.dtype + " " +
                                             shape_to_string(t.shape) + " in " +
                                             (t.shards.empty() ? "?" : t.shards[0].file) +
                                             " but " + have->dtype + " " +
                                             shape_to_string(have->shape) + " elsewhere");
    have->shards.insert(have->shards.end(), t.shards.begin(), t.shards.end());
  }
}

}  // namespace dtrain::checkpoint
