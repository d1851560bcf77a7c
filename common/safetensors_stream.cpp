// StreamWriter (safetensors_stream.h): placeholder header, data by append,
// the real header by pwrite at finish (JSON allows the trailing spaces that
// pad it to the reserved size; readers take the 8-byte length as given).
#include "common/safetensors_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dtrain::safetensors {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error(ErrorCode::checkpoint, msg); }

void pwrite_all(int fd, const void* data, size_t n, uint64_t off, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, off_t(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing " + path + " failed: " + std::strerror(errno));
    p += w;
    n -= size_t(w);
    off += uint64_t(w);
  }
}

}  // namespace

std::string StreamWriter::header(const std::map<std::string, std::string>& metadata) const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    const uint64_t n = uint64_t(numel(t.shape)) * dtype_size(t.dtype);
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  return h.dump();
}

StreamWriter::StreamWriter(std::string path, std::vector<TensorSpec> tensors,
                           const std::map<std::string, std::string>& metadata_bound)
    : path_(std::move(path)), tensors_(std::move(tensors)) {
  for (const auto& t : tensors_) total_ += uint64_t(numel(t.shape)) * dtype_size(t.dtype);
  header_size_ = header(metadata_bound).size();
  header_size_ += (8 - header_size_ % 8) % 8;  // the data section 8-byte aligned
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) fail("cannot create " + path_ + ": " + std::strerror(errno));
  const std::string blank(8 + header_size_, ' ');  // rewritten by finish()
  pwrite_all(fd_, blank.data(), blank.size(), 0, path_);
}

StreamWriter::~StreamWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void StreamWriter::append(const void* data, size_t n) {
  if (written_ + n > total_) fail("internal: " + path_ + ": more tensor bytes than its header declares");
  pwrite_all(fd_, data, n, 8 + header_size_ + written_, path_);
  written_ += n;
}

void StreamWriter::finish(const std::map<std::string, std::string>& metadata) {
  if (written_ != total_)
    fail("internal: " + path_ + ": " + std::to_string(written_) + " of " + std::to_string(total_) +
         " tensor bytes written");
  std::string text = header(metadata);
  if (text.size() > header_size_) fail("internal: " + path_ + ": the header outgrew the space reserved for it");
  text.append(header_size_ - text.size(), ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(header_size_ >> (8 * i));
  pwrite_all(fd_, len, 8, 0, path_);
  pwrite_all(fd_, text.data(), text.size(), 8, path_);
  if (::fsync(fd_) != 0) fail("fsync " + path_ + " failed: " + std::strerror(errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail("closing " + path_ + " failed: " + std::strerror(errno));
  }
  fd_ = -1;
}

}  // namespace dtrain::safetensors
