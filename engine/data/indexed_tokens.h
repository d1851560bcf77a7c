// The token stream of a Megatron indexed dataset (common/indexed_format.h):
// its sequences concatenated in index order, read from PREFIX.bin with pread
// through DataFile (data_file.h says why not a mapping). Does not make
// samples (dataset.cpp does) nor shuffle documents.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/indexed_format.h"
#include "engine/data/data_file.h"

namespace dtrain::engine::data {

class IndexedTokens {
 public:
  // Reads and checks the index (lengths, pointers within PREFIX.bin,
  // document indices) and every token against [0, vocab). Throws
  // dtrain::Error(config) naming the file and what was found.
  IndexedTokens(const std::string& prefix, int vocab);

  int64_t num_tokens() const { return num_tokens_; }
  const IndexedHeader& header() const { return header_; }
  // Tokens [first, first + n) of the stream into out[0..n), each checked
  // against the vocabulary again; throws as DataFile does when PREFIX.bin changed.
  void read(int64_t first, int64_t n, int64_t* out) const;
  void check() const { bin_->check(); }
  // [D + 1] first token of each document in the stream, then num_tokens():
  // the documents of PREFIX.idx's document index (sequences listed before
  // its first entry or after its last count as one document each end).
  const std::vector<int64_t>& document_starts() const { return doc_starts_; }

 private:
  void read_index();
  void check_all_tokens() const;
  // Tokens [first, first + n) that lie within one sequence at byte `at`.
  void read_run(int64_t at, int64_t n, int64_t* out) const;
  int64_t token(const unsigned char* p) const;

  IndexedHeader header_;
  std::unique_ptr<DataFile> bin_;
  int vocab_;
  int64_t num_tokens_ = 0;
  // Empty when the sequences lie back to back in PREFIX.bin (as Megatron's
  // builder writes them): token t is then at byte base_ + t * item_bytes.
  std::vector<int64_t> starts_;    // [n + 1] first token of each sequence in the stream
  std::vector<int64_t> pointers_;  // [n] byte offset of each sequence in PREFIX.bin
  int64_t base_ = 0;
  std::vector<int64_t> doc_starts_;
};

}  // namespace dtrain::engine::data
