// IndexedTokens (indexed_tokens.h): the index read once at open (lengths and
// pointers, 12 bytes a sequence, kept only when the sequences are not back to
// back), the whole of PREFIX.bin scanned once for the vocabulary check, then
// pread per window.
#include "engine/data/indexed_tokens.h"

#include <algorithm>

#include "common/error.h"

namespace dtrain::engine::data {
namespace {

[[noreturn]] void fail(const std::string& file, const std::string& what, const std::string& hint) {
  throw Error(ErrorCode::config, "data.path (format indexed): " + file + ": " + what, hint);
}

constexpr const char* kRewriteHint = "rewrite PREFIX.idx and PREFIX.bin together (Megatron's preprocess_data.py)";

}  // namespace

IndexedTokens::IndexedTokens(const std::string& prefix, int vocab)
    : header_(read_indexed_header(prefix)), vocab_(vocab) {
  bin_ = std::make_unique<DataFile>(header_.bin_path, kRewriteHint);
  // The header saw the size by stat; the open descriptor is what reads.
  header_.bin_bytes = bin_->size();
  read_index();
  check_all_tokens();
}

void IndexedTokens::read_index() {
  const IndexedHeader& h = header_;
  DataFile idx(h.idx_path, kRewriteHint);
  const int64_t n = h.sequences;
  std::vector<int32_t> lengths(static_cast<size_t>(n));
  std::vector<int64_t> pointers(static_cast<size_t>(n));
  std::vector<int64_t> docs(static_cast<size_t>(h.documents));
  // The format is little-endian; so is every host dtrain builds for.
  idx.read(h.lengths_offset, lengths.size() * 4, lengths.data());
  idx.read(h.pointers_offset, pointers.size() * 8, pointers.data());
  idx.read(h.documents_offset, docs.size() * 8, docs.data());
  starts_.assign(size_t(n + 1), 0);
  bool back_to_back = true;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = lengths[size_t(i)], ptr = pointers[size_t(i)];
    if (len < 0 || ptr < 0 || ptr + len * h.item_bytes > h.bin_bytes)
      fail(h.bin_path, "is " + std::to_string(h.bin_bytes) + " bytes, but sequence " + std::to_string(i) + " of " +
                           h.idx_path + " has " + std::to_string(len) + " tokens at byte " + std::to_string(ptr) +
                           " (truncated .bin, or an index of another file)",
           kRewriteHint);
    if (i > 0 && ptr != pointers[size_t(i - 1)] + int64_t(lengths[size_t(i - 1)]) * h.item_bytes) back_to_back = false;
    starts_[size_t(i + 1)] = starts_[size_t(i)] + len;
  }
  for (size_t j = 0; j < docs.size(); ++j) {
    if (docs[j] < 0 || docs[j] > n || (j > 0 && docs[j] < docs[j - 1]))
      fail(h.idx_path, "document index " + std::to_string(j) + " = " + std::to_string(docs[j]) +
                           " is not a sequence number in order within [0, " + std::to_string(n) + "]",
           kRewriteHint);
  }
  num_tokens_ = starts_.back();
  // Document boundaries as stream offsets: {0} + document index + {n}, each once.
  doc_starts_ = {0};
  for (int64_t seq : docs)
    if (starts_[size_t(seq)] > doc_starts_.back()) doc_starts_.push_back(starts_[size_t(seq)]);
  if (num_tokens_ > doc_starts_.back()) doc_starts_.push_back(num_tokens_);
  if (doc_starts_.size() == 1) doc_starts_.push_back(num_tokens_);
  if (back_to_back) {
    base_ = n > 0 ? pointers[0] : 0;
    starts_.clear();
    starts_.shrink_to_fit();
  } else {
    pointers_ = std::move(pointers);
  }
}

int64_t IndexedTokens::token(const unsigned char* p) const {
  const int w = header_.item_bytes;
  uint64_t v = 0;
  for (int i = w - 1; i >= 0; --i) v = (v << 8) | p[i];
  int64_t t = int64_t(v);
  if (header_.is_signed && w < 8 && (v >> (8 * w - 1)) != 0) t = int64_t(v) - (int64_t(1) << (8 * w));
  return t;
}

void IndexedTokens::read_run(int64_t at, int64_t n, int64_t* out) const {
  const int w = header_.item_bytes;
  std::vector<unsigned char> buf(size_t(std::min<int64_t>(n, int64_t(1) << 18) * w));
  for (int64_t done = 0; done < n;) {
    const int64_t k = std::min<int64_t>(n - done, int64_t(buf.size()) / w);
    bin_->read(at + done * w, size_t(k * w), buf.data());
    for (int64_t i = 0; i < k; ++i) {
      const int64_t t = token(&buf[size_t(i * w)]);
      if (t < 0 || t >= vocab_)
        fail(header_.bin_path, "token " + std::to_string(t) + " (" + header_.dtype + ") at byte " +
                                   std::to_string(at + (done + i) * w) + " is outside [0, model.vocab = " +
                                   std::to_string(vocab_) + ")",
             "set model.vocab above the largest token id, or re-tokenize with the model's tokenizer");
      out[done + i] = t;
    }
    done += k;
  }
}

void IndexedTokens::read(int64_t first, int64_t n, int64_t* out) const {
  if (first < 0 || n < 0 || first + n > num_tokens_)
    throw Error(ErrorCode::internal, "indexed dataset: tokens [" + std::to_string(first) + ", " +
                                         std::to_string(first + n) + ") outside [0, " + std::to_string(num_tokens_) + ")");
  const int w = header_.item_bytes;
  if (starts_.empty()) return read_run(base_ + first * w, n, out);
  // The sequence holding `first`, then run by run across sequence ends.
  size_t s = size_t(std::upper_bound(starts_.begin(), starts_.end(), first) - starts_.begin()) - 1;
  while (n > 0) {
    const int64_t in_seq = first - starts_[s];
    const int64_t k = std::min(n, starts_[s + 1] - first);
    if (k > 0) read_run(pointers_[s] + in_seq * w, k, out);
    first += k;
    out += k;
    n -= k;
    ++s;
  }
}

void IndexedTokens::check_all_tokens() const {
  std::vector<int64_t> chunk(size_t(1) << 18);
  for (int64_t t = 0; t < num_tokens_; t += int64_t(chunk.size()))
    read(t, std::min<int64_t>(int64_t(chunk.size()), num_tokens_ - t), chunk.data());
}

}  // namespace dtrain::engine::data
