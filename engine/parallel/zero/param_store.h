// Where ZeRO-3's offloaded parameter shards keep their bytes between uses
// (param_offload.h): a file per rank (train.offload.params: nvme, pread and
// pwrite) or a host buffer (train.offload.params: host: memcpy on a CPU,
// pinned and copied to and from the GPU by ParamOffload under a GPU).
// Offsets and sizes in bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

namespace dtrain::engine::parallel::zero {

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // n bytes at `offset` of the store into p (write = false) or from p.
  virtual void io(bool write, int64_t offset, char* p, int64_t n) = 0;
  // Throws when the store broke under the job (its file truncated or deleted).
  virtual void check() const = 0;
  virtual const std::string& file() const = 0;  // "" when not a file
  virtual std::string where() const = 0;        // for the log: "FILE" or "host memory"
  // The pinned host store's bytes as one fp32 tensor [elements] (the GPU's
  // copies read and write it directly); undefined for the others.
  virtual at::Tensor pinned() const { return {}; }
};

// Creates (or replaces) `file` at `bytes` bytes; removed when destroyed.
std::unique_ptr<ParamStore> make_file_store(const std::string& file, int64_t bytes);
// `bytes` bytes of host memory of its own (not the shards' allocator's, so
// the counting allocator sees a shard leave as it does under nvme).
std::unique_ptr<ParamStore> make_host_store(int64_t bytes);
// `elements` fp32 of pinned host memory: the host store under a GPU.
std::unique_ptr<ParamStore> make_pinned_host_store(int64_t elements);

}  // namespace dtrain::engine::parallel::zero
