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
// Elements of a shape; throws dtrain::Error(checkpoint) for a negative dim or
// a count past 2^63 (shapes come from files: [2^62+1, 4] must not wrap).
int64_t numel(const std::vector<int64_t>& shape);
// numel * dtype size into *bytes; false (nothing thrown) when a dim is
// negative, the dtype unknown, or the count or the bytes pass 2^63.
bool checked_nbytes(const std::vector<int64_t>& shape, const std::string& dtype, uint64_t* bytes);
std::string shape_text(const std::vector<int64_t>& shape);  // "[256, 64]"

// Opens `path` read-only as a regular file: O_NONBLOCK (a FIFO never blocks
// the open) and fstat, so a FIFO, device, socket or directory is refused;
// with follow_links false a symbolic link is refused too (O_NOFOLLOW).
// `what` names the file's role in messages. Returns the fd (O_NONBLOCK
// cleared); throws dtrain::Error(checkpoint).
int open_regular(const std::string& path, const std::string& what, bool follow_links);
// The whole of a small regular file (index.json, latest) through
// open_regular; refuses one over max_bytes.
std::string read_regular(const std::string& path, const std::string& what, uint64_t max_bytes,
                         bool follow_links = true);

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

// An open safetensors file. The constructor opens it with open_regular (a
// symbolic link is refused unless follow_links) and reads and checks the
// header: length within the file, valid JSON, known dtypes, every tensor's
// byte count equal to numel * dtype size without overflow, and every range
// inside the file (a truncated file is an error naming the first tensor
// past its end). So nothing read later can claim more bytes than the file has.
class File {
 public:
  explicit File(const std::string& path, bool follow_links = false);
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
  // For readers that map the file: the descriptor and where the data
  // section starts (a tensor's bytes are at data_start() + info.begin).
  int fd() const { return fd_; }
  uint64_t data_start() const { return data_start_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dtrain::safetensors
