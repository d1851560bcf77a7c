// write_rank_file and write_index (checkpoint_writer.h).
#include "common/checkpoint_writer.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/checkpoint_dir.h"
#include "common/crc32c.h"
#include "common/error.h"

namespace dtrain::checkpoint {

uint64_t write_rank_file(const std::string& dir, const std::string& file, std::vector<ShardData> shards,
                         const safetensors::WriteOptions& options) {
  std::vector<safetensors::TensorView> views;
  std::vector<TensorEntry> entries;
  uint64_t bytes = 0;
  for (auto& s : shards) {
    if (s.entry.shards.size() != 1)
      throw Error(ErrorCode::internal, "write_rank_file: " + s.entry.name + " needs exactly one shard");
    Shard& sh = s.entry.shards[0];
    std::vector<int64_t> ext;
    for (auto& r : sh.slice) ext.push_back(r.second - r.first);
    const size_t n = size_t(safetensors::numel(ext)) * safetensors::dtype_size(s.entry.dtype);
    sh.file = file;
    sh.crc32c = crc32c(s.data, n);
    bytes += n;
    views.push_back({sh.key, s.entry.dtype, ext, s.data});
    entries.push_back(s.entry);
  }
  safetensors::write_file(dir + "/" + file, views, {{kShardsMetadataKey, shards_to_metadata(entries)}}, options);
  return bytes;
}

void write_index(const std::string& dir, Index index) {
  index.tensors.clear();
  for (const auto& f : index.files) {
    safetensors::File file(dir + "/" + f);
    auto it = file.metadata().find(kShardsMetadataKey);
    if (it == file.metadata().end())
      throw Error(ErrorCode::checkpoint, file.path() + " has no " + kShardsMetadataKey + " metadata");
    add_shards(index, shards_from_metadata(it->second, file.path()));
  }
  const std::string path = dir + "/" + kIndexFile;
  {
    errno = 0;  // a full disk must read as one ("No space left on device"), not a bare failure
    std::ofstream out(path, std::ios::trunc);
    out << index_to_json(index);
    if (!out.flush())
      throw Error(ErrorCode::checkpoint, "cannot write " + path + (errno ? std::string(": ") + std::strerror(errno) : ""));
  }
  fsync_path(path);
}

}  // namespace dtrain::checkpoint
