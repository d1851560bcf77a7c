// The checkpoint index (index.json; docs/ARCHITECTURE.md, 'Checkpoints'): every
// logical tensor with its global shape and dtype, and per shard the rank file,
// the slice it covers ([start, stop) per dim) and its CRC-32C; plus step, mesh,
// the resolved spec, sampler position and schedule. Schema and JSON only:
// reading shards is checkpoint_reader.h, the directory protocol checkpoint_dir.h.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::checkpoint {

constexpr int kIndexVersion = 1;
constexpr const char* kIndexFile = "index.json";
constexpr uint64_t kMaxIndexBytes = uint64_t(1) << 30;  // an index.json larger than this is refused
// Key of the shard list in each rank file's __metadata__ (JSON text): the
// index is rebuilt from these headers by rank 0, so no shard bytes travel.
constexpr const char* kShardsMetadataKey = "dtrain.shards";

using Range = std::pair<int64_t, int64_t>;  // [start, stop) along one dim

struct Shard {
  std::string file;          // "rank_3.safetensors", relative to the checkpoint dir
  std::string key;           // tensor name inside that file
  std::vector<Range> slice;  // one range per dim of the global shape
  uint32_t crc32c = 0;
};

struct TensorEntry {
  std::string name;  // "model/blocks.0.attn.qkv.weight", "optim/exp_avg/...", "rng/cpu/rank_2"
  std::string dtype;  // safetensors dtype name
  std::vector<int64_t> shape;  // global
  std::vector<Shard> shards;
};

struct ScheduleState {
  double lr = 0, min_lr = 0;
  int64_t warmup_steps = 0, total_steps = 0;
};

struct Index {
  int version = kIndexVersion;
  int64_t step = 0;               // optimizer steps completed
  std::string mesh;               // "dp=4,tp=1,pp=1,ep=1"
  int world = 1;
  std::string model;              // model signature: "gpt vocab=256 layers=2 ..."
  int64_t sampler_consumed = 0;   // global samples consumed
  int64_t optimizer_step = 0;     // AdamW step count
  // Model weights only (an import from Hugging Face): no optimizer, sampler
  // or RNG state; a run loading it starts at step 0 with fresh ones.
  bool weights_only = false;
  ScheduleState schedule;
  std::string spec_yaml;          // the resolved spec the run used
  std::vector<std::string> files;  // every rank file, in rank order
  std::vector<TensorEntry> tensors;

  const TensorEntry* find(const std::string& name) const;
};

std::string index_to_json(const Index& index);
// Throws dtrain::Error(checkpoint) naming `source` on bad or incomplete JSON,
// and on an index that fails check_index.
Index index_from_json(const std::string& text, const std::string& source);

// An index read from disk is untrusted: throws dtrain::Error(checkpoint)
// naming `source` unless every file (index.files, each shard's) is a plain
// name of the index's "files" (no '/', not "." or ".."), every dtype is known,
// every shape's bytes fit in 2^63, every slice lies inside its shape, and the
// shards of each tensor hold every element exactly once (the message names
// the tensor, the overlapping shards and the region, or a region in no shard).
void check_index(const Index& index, const std::string& source);
bool is_plain_file_name(const std::string& name);

// One rank file's shard list (its __metadata__ entry): logical name, global
// shape, dtype, key and slice per tensor; crc32c filled in by the writer.
std::string shards_to_metadata(const std::vector<TensorEntry>& entries);
std::vector<TensorEntry> shards_from_metadata(const std::string& text, const std::string& source);

// Merge every rank file's shard list into index.tensors (first appearance
// order). Throws when one logical tensor is described with two shapes.
void add_shards(Index& index, const std::vector<TensorEntry>& from_one_file);

std::string shape_to_string(const std::vector<int64_t>& shape);
std::string slice_to_string(const std::vector<Range>& slice);

}  // namespace dtrain::checkpoint
