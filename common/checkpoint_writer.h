// Writing one checkpoint's files (no LibTorch): a rank's shards as one
// safetensors file whose header also lists them (logical name, global shape,
// slice, crc32c), and rank 0's index.json rebuilt from those headers once
// every rank has finished. The directory protocol is checkpoint_dir.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/checkpoint_index.h"
#include "common/safetensors.h"

namespace dtrain::checkpoint {

// One shard this rank holds: entry.name/dtype/shape are the logical tensor's;
// entry.shards has exactly one Shard (key and slice; file and crc are filled in).
struct ShardData {
  TensorEntry entry;
  const void* data = nullptr;  // contiguous bytes of the slice
};

// Writes <dir>/<file>; returns the bytes of tensor data written.
uint64_t write_rank_file(const std::string& dir, const std::string& file, std::vector<ShardData> shards,
                         const safetensors::WriteOptions& options = {});

// Fills index.tensors from the headers of index.files (in <dir>) and writes
// <dir>/index.json, fsynced. Throws when a file is missing or unreadable.
void write_index(const std::string& dir, Index index);

}  // namespace dtrain::checkpoint
