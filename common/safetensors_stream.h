// A safetensors file written tensor by tensor, for files larger than memory
// (HF import and export): the header's size is fixed up front (the tensors'
// names, dtypes and shapes, and a bound on the metadata), the data streams
// through append(), and finish() writes the header, padded with spaces to
// that size, once the metadata is known (e.g. checksums of the data).
// The file is written with O_DIRECT through an aligned staging buffer where
// the filesystem allows it: buffered writes of gigabytes cost a page-cache
// copy and dirty-page throttling (on a shared VM disk ~15x the time of the
// direct writes); elsewhere (tmpfs) it falls back to buffered writes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/safetensors.h"

namespace dtrain::safetensors {

struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

class StreamWriter {
 public:
  // Creates `path` (O_EXCL: never over an existing file). metadata_bound: a
  // metadata map at least as long, as JSON, as the one finish() will get.
  StreamWriter(std::string path, std::vector<TensorSpec> tensors,
               const std::map<std::string, std::string>& metadata_bound);
  ~StreamWriter();  // closes; the file stays (callers remove what they abandon)
  StreamWriter(const StreamWriter&) = delete;
  StreamWriter& operator=(const StreamWriter&) = delete;

  // The next bytes of the data section, in tensor order.
  void append(const void* data, size_t n);
  // Checks every byte arrived, writes the header with `metadata` and fsyncs.
  void finish(const std::map<std::string, std::string>& metadata);
  uint64_t data_bytes() const { return total_; }

 private:
  std::string header(const std::map<std::string, std::string>& metadata) const;
  void put(const void* data, size_t n);  // through the staging buffer
  void flush_staged(bool last);          // the staged bytes to the file
  std::string path_;
  std::vector<TensorSpec> tensors_;
  int fd_ = -1;
  uint64_t header_size_ = 0, total_ = 0, written_ = 0;
  // Bytes go to the file at file_off_ from stage_ (aligned, kStageBytes)
  // once it is full; direct_ = the file is open with O_DIRECT.
  bool direct_ = false;
  uint8_t* stage_ = nullptr;
  size_t staged_ = 0;
  uint64_t file_off_ = 0;
};

}  // namespace dtrain::safetensors
