// The token sources of dataset.h: "bytes" (the file read into memory, one
// token per byte), "tokens-u16"/"tokens-u32" (little-endian uint16/uint32 read
// per sample with pread, checked against the vocabulary at open and per read),
// "indexed" (Megatron's .idx/.bin pair, indexed_tokens.h) and
// "synthetic" (repeated random phrases with noise, deterministic from the
// seed, so a model can learn it). File-backed sources stop the run when their
// file changes under it (data_file.h). Sample i is tokens [i*T, i*T + T]
// (T = seq_len): non-overlapping windows.
#include "engine/data/dataset.h"

#include "common/error.h"
#include "engine/data/data_file.h"
#include "engine/data/indexed_tokens.h"

#include <ATen/ops/empty.h>

#include <algorithm>

namespace dtrain::engine::data {
namespace {

constexpr const char* kCorpusHint =
    "run scripts/make-corpus to build data/corpus.txt, or set data.path to an existing file";

[[noreturn]] void fail(const std::string& path, const std::string& what, const std::string& hint = kCorpusHint) {
  throw Error(ErrorCode::config, "data.path = '" + path + "': " + what, hint);
}

// B = batch (sample ids), T = seq_len. `read(id, w)` writes the T+1 tokens
// of sample `id` to w[0..T].
template <typename ReadWindow>
void fill_batch(const std::vector<int64_t>& ids, int seq_len, int64_t num_samples, ReadWindow read,
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
  std::vector<int64_t> w(size_t(T + 1));  // [T + 1]
  for (int64_t b = 0; b < B; ++b) {
    const int64_t id = ids[size_t(b)];
    if (id < 0 || id >= num_samples) {
      throw Error(ErrorCode::internal, "dataset: sample id " + std::to_string(id) + " outside [0, " +
                                           std::to_string(num_samples) + ")");
    }
    read(id, w.data());
    for (int64_t t = 0; t < T; ++t) {
      in[b * T + t] = w[size_t(t)];
      tg[b * T + t] = w[size_t(t + 1)];
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
  ByteDataset(const std::string& path, int seq_len, int vocab) : file_(path, kCorpusHint), seq_len_(seq_len) {
    bytes_.resize(size_t(file_.size()));
    file_.read(0, bytes_.size(), bytes_.data());
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
  // The bytes are in memory, but a file changed under the run would give a
  // restart (which reads it again) other samples: it stops the run as well.
  void get_batch(const std::vector<int64_t>& ids, at::Tensor& inputs, at::Tensor& targets) const override {
    file_.check();
    const unsigned char* p = bytes_.data();
    const int64_t T = seq_len_;
    fill_batch(ids, seq_len_, num_samples_,
               [p, T](int64_t id, int64_t* w) {
                 for (int64_t t = 0; t <= T; ++t) w[t] = p[id * T + t];
               },
               inputs, targets);
  }

 private:
  DataFile file_;
  std::vector<unsigned char> bytes_;
  int seq_len_;
  int64_t num_samples_ = 0;
};

// ---------------------------------------------------------------------------

// Little-endian uint16 or uint32 tokens (`width` bytes) read with pread
// (data_file.h says why not mmap): the whole file once at open for the
// vocabulary check, then each sample's window per batch, its tokens checked
// again (a rewrite that kept size and mtime must not index past the embedding).
class RawTokenDataset final : public TokenDataset {
 public:
  RawTokenDataset(const std::string& path, int width, int seq_len, int vocab)
      : file_(path, kCorpusHint), width_(width), seq_len_(seq_len), vocab_(vocab) {
    const int64_t size = file_.size();
    const std::string format = "tokens-u" + std::to_string(8 * width);
    if (size % width != 0)
      fail(path, "size " + std::to_string(size) + " bytes is not a multiple of " + std::to_string(width) +
                     ", not a file of uint" + std::to_string(8 * width) + " tokens",
           "format " + format + " expects little-endian uint" + std::to_string(8 * width) +
               " tokens; use format bytes for text");
    check_windows(path, size / width, seq_len);
    num_samples_ = windows(size / width, seq_len);
    std::vector<unsigned char> chunk(size_t(1) << 20);
    for (int64_t off = 0; off < size; off += int64_t(chunk.size())) {
      const size_t n = size_t(std::min<int64_t>(int64_t(chunk.size()), size - off));
      file_.read(off, n, chunk.data());
      for (size_t i = 0; i < n; i += size_t(width)) check_token(token(&chunk[i]), off + int64_t(i));
    }
  }

  int64_t num_samples() const override { return num_samples_; }
  int seq_len() const override { return seq_len_; }
  void get_batch(const std::vector<int64_t>& ids, at::Tensor& inputs, at::Tensor& targets) const override {
    file_.check();
    const int64_t T = seq_len_, w = width_;
    std::vector<unsigned char> buf(size_t(w * (T + 1)));
    fill_batch(ids, seq_len_, num_samples_,
               [&](int64_t id, int64_t* out) {
                 const int64_t off = w * id * T;
                 file_.read(off, buf.size(), buf.data());
                 for (int64_t t = 0; t <= T; ++t) out[t] = check_token(token(&buf[size_t(w * t)]), off + w * t);
               },
               inputs, targets);
  }

 private:
  // Little-endian whatever the host's byte order.
  int64_t token(const unsigned char* p) const {
    int64_t v = 0;
    for (int i = width_ - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
  }
  int64_t check_token(int64_t t, int64_t byte_offset) const {
    if (t >= vocab_)
      fail(file_.path(), "token " + std::to_string(t) + " at byte offset " + std::to_string(byte_offset) +
                             " is >= model.vocab = " + std::to_string(vocab_),
           "set model.vocab above the largest token id, or re-tokenize");
    return t;
  }

  DataFile file_;
  int width_;
  int seq_len_;
  int vocab_;
  int64_t num_samples_ = 0;
};

// Windows over the concatenated sequences of a Megatron indexed dataset, in
// index order (documents are not shuffled).
class IndexedDataset final : public TokenDataset {
 public:
  IndexedDataset(const std::string& prefix, int seq_len, int vocab) : tokens_(prefix, vocab), seq_len_(seq_len) {
    if (windows(tokens_.num_tokens(), seq_len) < 1)
      fail(prefix, tokens_.header().idx_path + " lists " + std::to_string(tokens_.num_tokens()) +
                       " tokens, too few for one sample of seq_len + 1 = " + std::to_string(seq_len + 1),
           "use a larger dataset or a smaller model.seq_len");
    num_samples_ = windows(tokens_.num_tokens(), seq_len);
  }
  int64_t num_samples() const override { return num_samples_; }
  int seq_len() const override { return seq_len_; }
  void get_batch(const std::vector<int64_t>& ids, at::Tensor& inputs, at::Tensor& targets) const override {
    tokens_.check();
    const int64_t T = seq_len_;
    fill_batch(ids, seq_len_, num_samples_, [&](int64_t id, int64_t* w) { tokens_.read(id * T, T + 1, w); },
               inputs, targets);
  }

 private:
  IndexedTokens tokens_;
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
    std::vector<std::vector<uint32_t>> phrases(kPhrases);
    for (auto& ph : phrases) {
      ph.resize(8 + splitmix64(s) % 24);
      for (auto& t : ph) t = uint32_t(splitmix64(s) % uint64_t(vocab));
    }
    const int64_t ntokens = std::max<int64_t>(kMinTokens, int64_t(seq_len) * 64 + 1);
    tokens_.reserve(size_t(ntokens) + 32);
    while (int64_t(tokens_.size()) < ntokens) {
      for (uint32_t t : phrases[splitmix64(s) % kPhrases]) {
        const uint64_t r = splitmix64(s);
        tokens_.push_back((r & 15) == 0 ? uint32_t((r >> 8) % uint64_t(vocab)) : t);
      }
    }
    tokens_.resize(size_t(ntokens));
    num_samples_ = windows(ntokens, seq_len);
  }
  int64_t num_samples() const override { return num_samples_; }
  int seq_len() const override { return seq_len_; }
  void get_batch(const std::vector<int64_t>& ids, at::Tensor& inputs, at::Tensor& targets) const override {
    const uint32_t* p = tokens_.data();
    const int64_t T = seq_len_;
    fill_batch(ids, seq_len_, num_samples_,
               [p, T](int64_t id, int64_t* w) {
                 for (int64_t t = 0; t <= T; ++t) w[t] = p[id * T + t];
               },
               inputs, targets);
  }

 private:
  std::vector<uint32_t> tokens_;
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
                                         " does not fit format tokens-u16 (at most 65536)",
                  "write the tokens as uint32 and use format tokens-u32");
    }
    return std::make_unique<RawTokenDataset>(path, 2, seq_len, vocab);
  }
  if (format == "tokens-u32") return std::make_unique<RawTokenDataset>(path, 4, seq_len, vocab);
  if (format == "indexed") return std::make_unique<IndexedDataset>(path, seq_len, vocab);
  if (format == "synthetic") return std::make_unique<SyntheticDataset>(seq_len, vocab, seed);
  throw Error(ErrorCode::config, "data.format = '" + format + "' is unknown",
              "use bytes, tokens-u16, tokens-u32, indexed or synthetic");
}

}  // namespace dtrain::engine::data
