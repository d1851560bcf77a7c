// The safetensors file format (huggingface/safetensors): 8-byte little-
// endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end)}, "__metadata__": {str: str}}, then raw
// little-endian data. Writer and checked reader; no LibTorch, no checkpoint
// semantics (those live in checkpoint_index.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dtrain::safetensors {

// Bytes per element of a safetensors dtype name ("F32", "I64", "U8", ...);
// throws dtrain::Error(checkpoint) for an unknown name.
size_t dtype_size(const std::string& dtype);
int64_t numel(const std::vector<int64_t>& shape);

// One tensor to write: contiguous row-major bytes.
struct TensorView {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

struct WriteOptions {
  bool fsync = true;
  // Called after each tensor's bytes are written (test hooks: crash mid-write).
  std::function<void(uint64_t written, uint64_t total)> progress;
};

// Writes `path` (truncating it); returns every tensor's CRC-32C, in order.
// Throws dtrain::Error(checkpoint) naming the file on any I/O failure.
std::vector<uint32_t> write_file(const std::string& path, const std::vector<TensorView>& tensors,
                                 const std::map<std::string, std::string>& metadata = {},
                                 const WriteOptions& options = {});

struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // offsets into the data section
  uint64_t nbytes() const { return end - begin; }
};

// An open safetensors file. The constructor reads and checks the header:
// length within the file, valid JSON, every tensor's byte count equal to
// numel * dtype size, and every range inside the file (a truncated file is
// an error naming the first tensor past its end).
class File {
 public:
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& at(const std::string& name) const;  // throws naming file and tensor
  // Reads a tensor's bytes into dst (info.nbytes() bytes).
  void read(const TensorInfo& info, void* dst) const;
  std::vector<uint8_t> read(const std::string& name) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dtrain::safetensors
