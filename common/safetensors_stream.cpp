// StreamWriter (safetensors_stream.h): placeholder header, data by append,
// the real header by pwrite at finish (JSON allows the trailing spaces that
// pad it to the reserved size; readers take the 8-byte length as given).
// O_DIRECT needs block-aligned buffers, offsets and lengths: everything goes
// through one aligned staging buffer written whole at aligned offsets; the
// last, partial block is padded, and the file truncated to its real size.
#include "common/safetensors_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dtrain::safetensors {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error(ErrorCode::checkpoint, msg); }

constexpr size_t kAlign = 4096;               // O_DIRECT: a multiple of any logical block size
constexpr size_t kStageBytes = size_t(8) << 20;  // 8 MiB per direct write

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
  stage_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kStageBytes));
  if (!stage_) fail("cannot allocate " + std::to_string(kStageBytes) + " bytes to write " + path_);
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
  fd_ = ::open(path_.c_str(), flags | O_DIRECT, 0644);
  direct_ = fd_ >= 0;
  if (fd_ < 0 && errno == EINVAL) fd_ = ::open(path_.c_str(), flags, 0644);  // no O_DIRECT here (tmpfs)
  if (fd_ < 0) {
    std::free(stage_);
    fail("cannot create " + path_ + ": " + std::strerror(errno));
  }
  const std::string blank(8 + header_size_, ' ');  // rewritten by finish()
  put(blank.data(), blank.size());
}

StreamWriter::~StreamWriter() {
  if (fd_ >= 0) ::close(fd_);
  std::free(stage_);
}

void StreamWriter::put(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const size_t k = std::min(n, kStageBytes - staged_);
    std::memcpy(stage_ + staged_, p, k);
    staged_ += k;
    p += k;
    n -= k;
    if (staged_ == kStageBytes) flush_staged(false);
  }
}

void StreamWriter::flush_staged(bool last) {
  size_t n = staged_;
  if (direct_ && last && n % kAlign != 0) {  // the padded last block; finish() truncates it away
    const size_t padded = (n + kAlign - 1) / kAlign * kAlign;
    std::memset(stage_ + n, 0, padded - n);
    n = padded;
  }
  const ssize_t w = direct_ ? ::pwrite(fd_, stage_, n, off_t(file_off_)) : 0;
  if (direct_ && w < 0 && errno == EINVAL) {  // the filesystem refused this direct write: buffered from here on
    direct_ = false;
    if (::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT) != 0)
      fail("writing " + path_ + " failed: " + std::strerror(errno));
  }
  if (direct_ && w != ssize_t(n))
    fail("writing " + path_ + " failed: " + (w < 0 ? std::strerror(errno) : "short write"));
  if (!direct_) pwrite_all(fd_, stage_, staged_, file_off_, path_);
  file_off_ += staged_;
  staged_ = 0;
}

void StreamWriter::append(const void* data, size_t n) {
  if (written_ + n > total_) fail("internal: " + path_ + ": more tensor bytes than its header declares");
  put(data, n);
  written_ += n;
}

void StreamWriter::finish(const std::map<std::string, std::string>& metadata) {
  if (written_ != total_)
    fail("internal: " + path_ + ": " + std::to_string(written_) + " of " + std::to_string(total_) +
         " tensor bytes written");
  std::string text = header(metadata);
  if (text.size() > header_size_) fail("internal: " + path_ + ": the header outgrew the space reserved for it");
  flush_staged(/*last=*/true);
  if (direct_) {  // the header goes through the page cache: small, unaligned
    if (::ftruncate(fd_, off_t(file_off_)) != 0) fail("truncating " + path_ + " failed: " + std::strerror(errno));
    if (::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT) != 0)
      fail("writing " + path_ + " failed: " + std::strerror(errno));
  }
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
