// safetensors writer and reader (safetensors.h). The writer streams each
// tensor through CRC-32C while writing; the reader uses pread so several
// tensors of one file may be read without loading the whole file.
#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/crc32c.h"
#include "common/error.h"

namespace dtrain::safetensors {
namespace {

[[noreturn]] void fail(const std::string& msg, const std::string& hint = {}) {
  throw Error(ErrorCode::checkpoint, msg, hint);
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing " + path + " failed: " + std::strerror(errno));
    p += w;
    n -= size_t(w);
  }
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace

size_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "U8" || d == "I8" || d == "BOOL") return 1;
  fail("unknown safetensors dtype " + d);
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<uint32_t> write_file(const std::string& path, const std::vector<TensorView>& tensors,
                                 const std::map<std::string, std::string>& metadata,
                                 const WriteOptions& options) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t n = uint64_t(numel(t.shape)) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  const uint64_t total = offset;

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail("cannot create " + path + ": " + std::strerror(errno));
  std::vector<uint32_t> crcs;
  try {
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    write_all(fd, len, 8, path);
    write_all(fd, text.data(), text.size(), path);
    uint64_t written = 0;
    for (const auto& t : tensors) {
      const size_t n = size_t(numel(t.shape)) * dtype_size(t.dtype);
      crcs.push_back(crc32c(t.data, n));
      write_all(fd, t.data, n, path);
      written += n;
      if (options.progress) options.progress(written, total);
    }
    if (options.fsync && ::fsync(fd) != 0) fail("fsync " + path + " failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail("closing " + path + " failed: " + std::strerror(errno));
  return crcs;
}

File::File(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open " + path + ": " + std::strerror(errno));
  try {
    struct stat st {};
    ::fstat(fd_, &st);
    const uint64_t size = uint64_t(st.st_size);
    unsigned char len[8];
    if (size < 8 || ::pread(fd_, len, 8, 0) != 8)
      fail(path + ": truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
    if (n > size - 8)
      fail(path + ": truncated or not safetensors: header length " + std::to_string(n) +
           " but the file has " + std::to_string(size) + " bytes");
    std::string text(n, '\0');
    if (::pread(fd_, text.data(), n, 8) != ssize_t(n)) fail("reading the header of " + path + " failed");
    data_start_ = 8 + n;
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      fail(path + ": header is not valid JSON: " + e.what());
    }
    for (auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        for (auto& [mk, mv] : value.items()) metadata_[mk] = mv.get<std::string>();
        continue;
      }
      TensorInfo t;
      t.name = key;
      try {
        t.dtype = value.at("dtype").get<std::string>();
        t.shape = value.at("shape").get<std::vector<int64_t>>();
        auto off = value.at("data_offsets").get<std::vector<uint64_t>>();
        if (off.size() != 2) fail(path + ": tensor " + key + ": data_offsets needs 2 numbers");
        t.begin = off[0];
        t.end = off[1];
      } catch (const nlohmann::json::exception& e) {
        fail(path + ": tensor " + key + ": bad header entry: " + e.what());
      }
      const uint64_t want = uint64_t(numel(t.shape)) * dtype_size(t.dtype);
      if (t.end < t.begin || t.nbytes() != want)
        fail(path + ": tensor " + key + ": data_offsets [" + std::to_string(t.begin) + ", " +
             std::to_string(t.end) + ") hold " + std::to_string(t.end - t.begin) + " bytes but " +
             t.dtype + " " + shape_text(t.shape) + " needs " + std::to_string(want));
      if (data_start_ + t.end > size)
        fail(path + ": truncated: tensor " + key + " needs bytes up to " +
                 std::to_string(data_start_ + t.end) + " but the file has only " +
                 std::to_string(size),
             "the file was cut short (a crash or a full disk while copying); use another checkpoint");
      tensors_.push_back(std::move(t));
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* File::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorInfo& File::at(const std::string& name) const {
  if (const TensorInfo* t = find(name)) return *t;
  fail(path_ + ": has no tensor " + name);
}

void File::read(const TensorInfo& info, void* dst) const {
  auto* p = static_cast<char*>(dst);
  uint64_t off = data_start_ + info.begin, left = info.nbytes();
  while (left > 0) {
    ssize_t r = ::pread(fd_, p, left, off_t(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail(path_ + ": reading tensor " + info.name + " failed (file truncated?)");
    p += r;
    off += uint64_t(r);
    left -= uint64_t(r);
  }
}

std::vector<uint8_t> File::read(const std::string& name) const {
  const TensorInfo& info = at(name);
  std::vector<uint8_t> buf(info.nbytes());
  read(info, buf.data());
  return buf;
}

}  // namespace dtrain::safetensors
