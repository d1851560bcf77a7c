// Megatron's indexed dataset (PREFIX.idx + PREFIX.bin, "MMIDIDX" version 1):
// the header of PREFIX.idx read and checked against both files' sizes. No
// LibTorch, so the launcher refuses a bad dataset before any worker starts;
// the engine (engine/data/indexed_dataset.h) reads the arrays and the tokens.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain {

// PREFIX.idx: 9-byte magic "MMIDIDX\0\0", uint64 version 1, uint8 dtype
// code, uint64 sequence count n, uint64 document count d, then int32
// lengths[n] (tokens), int64 pointers[n] (byte offsets into .bin), int64
// document_indices[d] (sequence index where each document starts, plus n).
struct IndexedHeader {
  std::string idx_path, bin_path;
  int dtype_code = 0;
  std::string dtype;    // "uint16", "int32", ...
  int item_bytes = 0;   // bytes per token
  bool is_signed = false;
  int64_t sequences = 0, documents = 0;
  int64_t lengths_offset = 0, pointers_offset = 0, documents_offset = 0;
  int64_t bin_bytes = 0;  // size of PREFIX.bin at the check
};

// Opens PREFIX.idx and PREFIX.bin (stat, header), checks the magic, version,
// dtype code (integer token types only), that PREFIX.idx is exactly as long
// as its counts say, and that the last sequence ends within PREFIX.bin.
// Throws dtrain::Error(config) naming the file and what was found.
IndexedHeader read_indexed_header(const std::string& prefix);

// Before any worker starts: read_indexed_header, then every token of the
// first and last sequences (the ends of the file a wrong dtype or tokenizer
// shows first) against [0, vocab), and PREFIX.json (`dtrain data prepare`'s
// record, when present): its vocab_size must not exceed `vocab`. Throws
// dtrain::Error(config) naming the file, what was found and the fix.
void check_indexed_dataset(const std::string& prefix, int vocab);

}  // namespace dtrain
