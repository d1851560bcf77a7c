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

}  // namespace

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

bool checked_nbytes(const std::vector<int64_t>& shape, const std::string& dtype, uint64_t* bytes) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  int64_t b = 0;
  try {
    if (__builtin_mul_overflow(n, int64_t(dtype_size(dtype)), &b)) return false;
  } catch (const Error&) {
    return false;
  }
  *bytes = uint64_t(b);
  return true;
}

int open_regular(const std::string& path, const std::string& what, bool follow_links) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow_links ? 0 : O_NOFOLLOW));
  if (fd < 0 && errno == ELOOP && !follow_links)
    fail(what + " " + path + " is a symbolic link; a checkpoint's files must be regular files in its directory",
         "copy the file itself into the checkpoint directory (cp -L)");
  if (fd < 0) fail("cannot open " + what + " " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                     : S_ISSOCK(st.st_mode) ? "a socket" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                     : "not a regular file";
    ::close(fd);
    fail(what + " " + path + " is " + kind + ", not a regular file; it is not read",
         "a checkpoint holds regular files only; replace it with the real file");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_regular(const std::string& path, const std::string& what, uint64_t max_bytes,
                         bool follow_links) {
  const int fd = open_regular(path, what, follow_links);
  struct stat st {};
  ::fstat(fd, &st);
  if (uint64_t(st.st_size) > max_bytes) {
    ::close(fd);
    fail(what + " " + path + " has " + std::to_string(st.st_size) + " bytes, more than the " +
         std::to_string(max_bytes) + " such a file may have");
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    text.append(buf, size_t(r));
    if (text.size() > max_bytes) break;  // grew while read
  }
  ::close(fd);
  return text;
}

size_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "U8" || d == "I8" || d == "BOOL") return 1;
  fail("unknown safetensors dtype " + d);
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      fail("shape " + shape_text(shape) + (d < 0 ? " has a negative dim" : " has more than 2^63 elements"));
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

namespace {

// One header entry, checked against the file: known dtype, shape whose
// bytes do not overflow, offsets that hold exactly those bytes and lie in
// the data section (compared without adding, so huge offsets cannot wrap).
TensorInfo check_entry(const std::string& path, const std::string& key, const nlohmann::json& value,
                       uint64_t data_start, uint64_t size) {
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
  uint64_t want = 0;
  if (!checked_nbytes(t.shape, t.dtype, &want))
    fail(path + ": tensor " + key + ": " + t.dtype + " " + shape_text(t.shape) +
         " is not a valid tensor (unknown dtype, negative dim, or more than 2^63 bytes)");
  if (t.end < t.begin || t.nbytes() != want)
    fail(path + ": tensor " + key + ": data_offsets [" + std::to_string(t.begin) + ", " +
         std::to_string(t.end) + ") hold " + std::to_string(t.end < t.begin ? 0 : t.end - t.begin) +
         " bytes but " + t.dtype + " " + shape_text(t.shape) + " needs " + std::to_string(want));
  if (t.end > size - data_start)
    fail(path + ": truncated: tensor " + key + " needs bytes up to " +
             (t.end > UINT64_MAX - data_start ? std::string("past 2^64") : std::to_string(data_start + t.end)) +
             " but the file has only " + std::to_string(size),
         "the file was cut short (a crash or a full disk while copying); use another checkpoint");
  return t;
}

}  // namespace

File::File(const std::string& path, bool follow_links) : path_(path) {
  fd_ = open_regular(path, "safetensors file", follow_links);
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
    constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
    if (n > kMaxHeaderBytes)
      fail(path + ": header length " + std::to_string(n) + " is over the format's limit of " +
           std::to_string(kMaxHeaderBytes) + " bytes");
    std::string text(n, '\0');
    if (::pread(fd_, text.data(), n, 8) != ssize_t(n)) fail("reading the header of " + path + " failed");
    data_start_ = 8 + n;
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      fail(path + ": header is not valid JSON: " + e.what());
    }
    if (!header.is_object()) fail(path + ": header is not a JSON object");
    for (auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        try {
          for (auto& [mk, mv] : value.items()) metadata_[mk] = mv.get<std::string>();
        } catch (const nlohmann::json::exception& e) {
          fail(path + ": __metadata__ must map strings to strings: " + e.what());
        }
        continue;
      }
      tensors_.push_back(check_entry(path, key, value, data_start_, size));
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
