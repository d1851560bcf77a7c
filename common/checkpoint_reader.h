// Reading a checkpoint through its index (checkpoint_index.h): any region of
// a logical tensor is assembled from the shards that overlap it, each
// shard's CRC-32C checked on read, so a checkpoint saved on one mesh loads
// on another. Also whole-checkpoint verification, the model-compatibility
// check and merging into one safetensors file. No LibTorch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/checkpoint_index.h"
#include "common/safetensors.h"

namespace dtrain::checkpoint {

class CheckpointReader {
 public:
  // Reads <dir>/index.json (check_index: plain file names, sound shapes,
  // every element in exactly one shard) and checks that every rank file it
  // lists is a regular file in dir (a missing one is an error naming the
  // file and what it held; a link, FIFO or directory is refused unopened).
  explicit CheckpointReader(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const Index& index() const { return index_; }
  const TensorEntry& at(const std::string& name) const;  // throws naming the tensor

  // Copies region (one [start, stop) per dim) of tensor `name` into dst,
  // row-major over the region. Throws when the shards do not cover it.
  void read_region(const std::string& name, const std::vector<Range>& region, void* dst);
  std::vector<uint8_t> read_full(const std::string& name);

  // Checks every shard: header entry present, dtype and extents match the
  // slice, checksum. Returns the bytes verified; throws on the first problem.
  uint64_t verify_all();
  // Opens every rank file's header (no tensor data) and checks each shard's
  // entry against the index; after it, a tensor's bytes are known to be in
  // its files, so buffers sized from the index are bounded by them.
  void check_headers();

 private:
  safetensors::File& file(const std::string& name);
  // The shard's header entry, checked against the index (dtype, extents).
  const safetensors::TensorInfo& shard_info(const TensorEntry& t, const Shard& s);
  // Reads one shard's bytes and checks its dtype, shape and checksum.
  std::vector<uint8_t> read_shard(const TensorEntry& t, const Shard& s);
  // The same into dst (shard_info's nbytes); on a checksum mismatch dst
  // holds the bad bytes and it throws.
  void read_shard_into(const TensorEntry& t, const Shard& s, void* dst);
  std::string dir_;
  Index index_;
  std::map<std::string, std::unique_ptr<safetensors::File>> files_;
};

// What a model expects to find (logical name, dtype, global shape).
struct ExpectedTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

// Throws dtrain::Error(checkpoint) listing every difference: another model
// signature, tensors missing from the checkpoint, shape or dtype mismatches.
void check_compatible(const Index& index, const std::string& dir, const std::string& model,
                      const std::vector<ExpectedTensor>& expected);

struct MergeStats {
  int tensors = 0;
  uint64_t bytes = 0;
};
// One safetensors file of full tensors: "model/<p>" as "<p>" (the model's
// stable names), with_optimizer adds "optim/exp_avg/<p>" as
// "optim.exp_avg.<p>" (and exp_avg_sq). RNG states are left out.
MergeStats merge(const std::string& dir, const std::string& out_path, bool with_optimizer);

}  // namespace dtrain::checkpoint
