// The token sources of dataset.h: "bytes" (the file read into memory, one
// token per byte), "tokens-u16" (mmap'd little-endian uint16, checked against
// the vocabulary once at open) and "synthetic" (repeated random phrases with
// noise, deterministic from the seed, so a model can learn it). Sample i is
// tokens [i*T, i*T + T] (T = seq_len): non-overlapping windows.
#include "engine/data/dataset.h"

#include "common/error.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dtrain::engine::data {
namespace {

constexpr const char* kCorpusHint =
    "run scripts/make-corpus to build data/corpus.txt, or set data.path to an existing file";

[[noreturn]] void fail(const std::string& path, const std::string& what, const std::string& hint = kCorpusHint) {
  throw Error(ErrorCode::config, "data.path = '" + path + "': " + what, hint);
}

// B = batch (sample ids), T = seq_len. `tok(i)` returns token i of the stream.
template <typename TokenAt>
void fill_batch(const std::vector<int64_t>& ids, int seq_len, int64_t num_samples, TokenAt tok,
                at::Tensor& inputs, at::Tensor& targets) {
  const int64_t B = int64_t(ids.size()), T = seq_len;
  auto shape_ok = [&](const at::Tensor& t) {
    return t.defined() && t.scalar_type() == at::kLong && t.is_contiguous() && t.device().is_cpu() &&
           t.dim() == 2 && t.size(0) == B && t.size(1) == T;
  };
  if (!shape_ok(inputs)) inputs = at::empty({B, T}, at::kLong);    // [B, T]
  if (!shape_ok(targets)) targets = at::empty({B, T}, at::kLong);  // [B, T]
  int64_t* in = inputs.data_ptr<int64_t>();
  int64_t* tg = targets.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t id = ids[size_t(b)];
    if (id < 0 || id >= num_samples) {
      throw Error(ErrorCode::internal, "dataset: sample id " + std::to_string(id) + " outside [0, " +
                                           std::to_string(num_samples) + ")");
    }
    const int64_t start = id * T;
    int64_t prev = tok(start);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t next = tok(start + t + 1);
      in[b * T + t] = prev;
      tg[b * T + t] = next;
      prev = next;
    }
  }
}

int64_t windows(int64_t ntokens, int seq_len) { return ntokens < 1 ? 0 : (ntokens - 1) / seq_len; }

void check_windows(const std::string& path, int64_t ntokens, int seq_len) {
  if (windows(ntokens, seq_len) < 1) {
    fail(path, "holds " + std::to_string(ntokens) + " tokens, too few for one sample of seq_len + 1 = " +
                   std::to_string(seq_len + 1));
  }
}

// ---------------------------------------------------------------------------

class ByteDataset final : public TokenDataset {
 public:
  ByteDataset(const std::string& path, int seq_len, int vocab) : seq_len_(seq_len) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
    bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    check_windows(path, int64_t(bytes_.size()), seq_len);
    if (vocab < 256) {
      for (size_t i = 0; i < bytes_.size(); ++i) {
        if (bytes_[i] >= vocab) {
          fail(path, "byte " + std::to_string(int(bytes_[i])) + " at offset " + std::to_string(i) +
                         " is >= model.vocab = " + std::to_string(vocab),
               "format bytes needs model.vocab = 256");
        }
      }
    }
    num_samples_ = windows(int64_t(bytes_.size()), seq_len);
  }
  int64_t num_samples() const override { return num_samples_; }
  int seq_len() const override { return seq_len_; }
  void get_batch(const std::vector<int64_t>& ids, at::Tensor& inputs, at::Tensor& targets) const override {
    const unsigned char* p = bytes_.data();
    fill_batch(ids, seq_len_, num_samples_, [p](int64_t i) { return int64_t(p[i]); }, inputs, targets);
  }

 private:
  std::vector<unsigned char> bytes_;
  int seq_len_;
  int64_t num_samples_ = 0;
};

// ---------------------------------------------------------------------------

class U16Dataset final : public TokenDataset {
 public:
  U16Dataset(const std::string& path, int seq_len, int vocab) : seq_len_(seq_len) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fail(path, std::string("cannot stat (") + std::strerror(err) + ")");
    }
    size_ = size_t(st.st_size);
    if (size_ % 2 != 0) {
      ::close(fd);
      fail(path, "size " + std::to_string(size_) + " bytes is odd, not a file of uint16 tokens",
           "format tokens-u16 expects little-endian uint16 tokens; use format bytes for text");
    }
    if (windows(int64_t(size_ / 2), seq_len) < 1) {
      ::close(fd);
      check_windows(path, int64_t(size_ / 2), seq_len);
    }
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps the file alive
    if (m == MAP_FAILED) fail(path, std::string("cannot mmap (") + std::strerror(err) + ")");
    data_ = static_cast<const unsigned char*>(m);
    num_samples_ = windows(int64_t(size_ / 2), seq_len);
    for (size_t i = 0; i < size_ / 2; ++i) {
      const int64_t t = token(int64_t(i));
      if (t >= vocab) {
        const std::string where = "token " + std::to_string(t) + " at byte offset " + std::to_string(2 * i) +
                                  " is >= model.vocab = " + std::to_string(vocab);
        ::munmap(const_cast<unsigned char*>(data_), size_);
        data_ = nullptr;
        fail(path, where, "set model.vocab above the largest token id, or re-tokenize");
      }
    }
  }
  ~U16Dataset() override {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  U16Dataset(const U16Dataset&) = delete;
  U16Dataset& operator=(const U16Dataset&) = delete;

  int64_t num_samples() const override { return num_samples_; }
  int seq_len() const override { return seq_len_; }
  void get_batch(const std::vector<int64_t>& ids, at::Tensor& inputs, at::Tensor& targets) const override {
    fill_batch(ids, seq_len_, num_samples_, [this](int64_t i) { return token(i); }, inputs, targets);
  }

 private:
  // Little-endian whatever the host's byte order.
  int64_t token(int64_t i) const { return int64_t(data_[2 * i]) | (int64_t(data_[2 * i + 1]) << 8); }
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  int seq_len_;
  int64_t num_samples_ = 0;
};

// ---------------------------------------------------------------------------

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A stream of kPhrases random phrases (8-31 tokens each) picked at random,
// with 1 token in 16 replaced by noise: within a phrase the next token is
// predictable, so the loss can fall far below ln(vocab).
class SyntheticDataset final : public TokenDataset {
 public:
  static constexpr int kPhrases = 32;
  static constexpr int64_t kMinTokens = int64_t(1) << 20;

  SyntheticDataset(int seq_len, int vocab, uint64_t seed) : seq_len_(seq_len) {
    uint64_t s = seed ^ 0x5EED5EED5EED5EEDULL;
    std::vector<std::vector<uint16_t>> phrases(kPhrases);
    for (auto& ph : phrases) {
      ph.resize(8 + splitmix64(s) % 24);
      for (auto& t : ph) t = uint16_t(splitmix64(s) % uint64_t(vocab));
    }
    const int64_t ntokens = std::max<int64_t>(kMinTokens, int64_t(seq_len) * 64 + 1);
    tokens_.reserve(size_t(ntokens) + 32);
    while (int64_t(tokens_.size()) < ntokens) {
      for (uint16_t t : phrases[splitmix64(s) % kPhrases]) {
        const uint64_t r = splitmix64(s);
        tokens_.push_back((r & 15) == 0 ? uint16_t((r >> 8) % uint64_t(vocab)) : t);
      }
    }
    tokens_.resize(size_t(ntokens));
    num_samples_ = windows(ntokens, seq_len);
  }
  int64_t num_samples() const override { return num_samples_; }
  int seq_len() const override { return seq_len_; }
  void get_batch(const std::vector<int64_t>& ids, at::Tensor& inputs, at::Tensor& targets) const override {
    const uint16_t* p = tokens_.data();
    fill_batch(ids, seq_len_, num_samples_, [p](int64_t i) { return int64_t(p[i]); }, inputs, targets);
  }

 private:
  std::vector<uint16_t> tokens_;
  int seq_len_;
  int64_t num_samples_ = 0;
};

}  // namespace

std::unique_ptr<TokenDataset> open_dataset(const std::string& format, const std::string& path, int seq_len,
                                           int vocab, uint64_t seed) {
  if (seq_len < 1 || vocab < 1) {
    throw Error(ErrorCode::config, "data: seq_len = " + std::to_string(seq_len) + " and vocab = " +
                                       std::to_string(vocab) + " must be >= 1");
  }
  if (format == "bytes") return std::make_unique<ByteDataset>(path, seq_len, vocab);
  if (format == "tokens-u16") {
    if (vocab > 65536) {
      throw Error(ErrorCode::config, "model.vocab = " + std::to_string(vocab) +
                                         " does not fit format tokens-u16 (at most 65536)");
    }
    return std::make_unique<U16Dataset>(path, seq_len, vocab);
  }
  if (format == "synthetic") {
    if (vocab > 65536) {
      throw Error(ErrorCode::config, "model.vocab = " + std::to_string(vocab) +
                                         " is too large for format synthetic (at most 65536)");
    }
    return std::make_unique<SyntheticDataset>(seq_len, vocab, seed);
  }
  throw Error(ErrorCode::config, "data.format = '" + format + "' is unknown",
              "use bytes, tokens-u16 or synthetic");
}

}  // namespace dtrain::engine::data
