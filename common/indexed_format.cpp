// read_indexed_header and check_indexed_dataset (indexed_format.h): the
// header, the first and last sequences' extents and tokens, and PREFIX.json,
// read with std::ifstream (the arrays and the rest of .bin stay on disk).
#include "common/indexed_format.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dtrain {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;
constexpr const char* kHint =
    "data.format indexed reads a Megatron indexed dataset: data.path is the prefix (no extension) of "
    "PREFIX.idx and PREFIX.bin as written by Megatron's preprocess_data.py or IndexedDatasetBuilder; "
    "rewrite the pair if it is damaged";

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw Error(ErrorCode::config, "data.path (format indexed): " + file + ": " + what, kHint);
}

int64_t regular_size(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) fail(file, std::string("cannot stat (") + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) fail(file, "is not a regular file");
  return int64_t(st.st_size);
}

// Little-endian whatever the host's byte order.
uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void read_at(std::ifstream& in, const std::string& file, int64_t offset, int n, unsigned char* out) {
  in.seekg(offset);
  if (!in.read(reinterpret_cast<char*>(out), n)) fail(file, "cannot read " + std::to_string(n) +
                                                              " bytes at offset " + std::to_string(offset));
}

void set_dtype(IndexedHeader& h) {
  struct Code { const char* name; int bytes; bool is_signed; };
  static const Code kCodes[] = {{"", 0, false},         {"uint8", 1, false}, {"int8", 1, true},
                                {"int16", 2, true},     {"int32", 4, true},  {"int64", 8, true},
                                {"float64", 8, true},   {"float32", 4, true}, {"uint16", 2, false}};
  if (h.dtype_code < 1 || h.dtype_code > 8)
    fail(h.idx_path, "dtype code " + std::to_string(h.dtype_code) +
                         " is not one Megatron defines (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, "
                         "6 float64, 7 float32, 8 uint16)");
  const Code& c = kCodes[h.dtype_code];
  if (h.dtype_code == 6 || h.dtype_code == 7)
    fail(h.idx_path, "dtype code " + std::to_string(h.dtype_code) + " (" + c.name + ") holds no token ids");
  h.dtype = c.name;
  h.item_bytes = c.bytes;
  h.is_signed = c.is_signed;
}

}  // namespace

IndexedHeader read_indexed_header(const std::string& prefix) {
  IndexedHeader h;
  h.idx_path = prefix + ".idx";
  h.bin_path = prefix + ".bin";
  const int64_t idx_bytes = regular_size(h.idx_path);
  h.bin_bytes = regular_size(h.bin_path);
  std::ifstream in(h.idx_path, std::ios::binary);
  if (!in) fail(h.idx_path, std::string("cannot open (") + std::strerror(errno) + ")");
  if (idx_bytes < kHeaderBytes)
    fail(h.idx_path, "is " + std::to_string(idx_bytes) + " bytes, shorter than the " +
                         std::to_string(kHeaderBytes) + "-byte header");
  unsigned char b[kHeaderBytes];
  read_at(in, h.idx_path, 0, int(kHeaderBytes), b);
  if (std::memcmp(b, kMagic, 9) != 0) {
    std::string found;
    for (int i = 0; i < 9; ++i) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", unsigned(b[i]));
      found += (b[i] >= 32 && b[i] < 127) ? std::string(1, char(b[i])) : std::string(hex);
    }
    fail(h.idx_path, "magic '" + found + "' is not MMIDIDX\\0\\0 (not a Megatron indexed dataset index)");
  }
  const uint64_t version = le(b + 9, 8);
  if (version != 1) fail(h.idx_path, "version " + std::to_string(version) + " is not 1, the only one known");
  h.dtype_code = int(b[17]);
  set_dtype(h);
  const uint64_t n = le(b + 18, 8), d = le(b + 26, 8);
  // Counts bounded by the file size before any multiplication can overflow.
  if (n > uint64_t(idx_bytes) || d > uint64_t(idx_bytes))
    fail(h.idx_path, "counts " + std::to_string(n) + " sequences, " + std::to_string(d) +
                         " documents exceed the file's " + std::to_string(idx_bytes) + " bytes");
  h.sequences = int64_t(n);
  h.documents = int64_t(d);
  h.lengths_offset = kHeaderBytes;
  h.pointers_offset = h.lengths_offset + 4 * h.sequences;
  h.documents_offset = h.pointers_offset + 8 * h.sequences;
  const int64_t expected = h.documents_offset + 8 * h.documents;
  if (idx_bytes != expected)
    fail(h.idx_path, "is " + std::to_string(idx_bytes) + " bytes; its header (" + std::to_string(n) +
                         " sequences, " + std::to_string(d) + " documents) needs " + std::to_string(expected) +
                         (idx_bytes < expected ? " (truncated)" : ""));
  if (h.sequences > 0) {
    unsigned char len[4], ptr[8];
    read_at(in, h.idx_path, h.lengths_offset + 4 * (h.sequences - 1), 4, len);
    read_at(in, h.idx_path, h.pointers_offset + 8 * (h.sequences - 1), 8, ptr);
    const int64_t end = int64_t(le(ptr, 8)) + int64_t(int32_t(le(len, 4))) * h.item_bytes;
    if (end > h.bin_bytes)
      fail(h.bin_path, "is " + std::to_string(h.bin_bytes) + " bytes, but " + h.idx_path +
                           " places its last sequence up to byte " + std::to_string(end) + " (truncated .bin?)");
  }
  return h;
}

namespace {

// Tokens of sequence `i` (at most kMaxChecked of them) against [0, vocab).
void check_sequence_tokens(const IndexedHeader& h, std::ifstream& idx, int64_t i, const char* which, int vocab) {
  constexpr int64_t kMaxChecked = int64_t(1) << 20;
  unsigned char len_b[4], ptr_b[8];
  read_at(idx, h.idx_path, h.lengths_offset + 4 * i, 4, len_b);
  read_at(idx, h.idx_path, h.pointers_offset + 8 * i, 8, ptr_b);
  const int64_t len = std::min<int64_t>(int32_t(le(len_b, 4)), kMaxChecked), ptr = int64_t(le(ptr_b, 8));
  if (len <= 0) return;
  if (ptr < 0 || ptr + len * h.item_bytes > h.bin_bytes)
    fail(h.bin_path, "is " + std::to_string(h.bin_bytes) + " bytes, but " + h.idx_path + " places its " + which +
                         " sequence at bytes [" + std::to_string(ptr) + ", " + std::to_string(ptr + len * h.item_bytes) +
                         ") (truncated .bin?)");
  std::ifstream bin(h.bin_path, std::ios::binary);
  std::string buf(size_t(len * h.item_bytes), '\0');
  bin.seekg(ptr);
  if (!bin.read(buf.data(), std::streamsize(buf.size())))
    fail(h.bin_path, "cannot read " + std::to_string(buf.size()) + " bytes at offset " + std::to_string(ptr));
  for (int64_t t = 0; t < len; ++t) {
    const auto* p = reinterpret_cast<const unsigned char*>(buf.data()) + t * h.item_bytes;
    const uint64_t v = le(p, h.item_bytes);
    int64_t id = int64_t(v);
    if (h.is_signed && h.item_bytes < 8 && (v >> (8 * h.item_bytes - 1)) != 0) id -= int64_t(1) << (8 * h.item_bytes);
    if (id < 0 || id >= vocab)
      throw Error(ErrorCode::config,
                  "data.path (format indexed): " + h.bin_path + ": token " + std::to_string(id) + " (" + h.dtype +
                      ") at byte " + std::to_string(ptr + t * h.item_bytes) + ", in the " + which +
                      " sequence, is outside [0, model.vocab = " + std::to_string(vocab) + ")",
                  "set model.vocab to the tokenizer's vocabulary size (above every token id), or re-tokenize "
                  "with the model's tokenizer (dtrain data prepare)");
  }
}

// PREFIX.json from `dtrain data prepare`: {"tokenizer": ..., "vocab_size": N, "eod_id": ...}.
void check_prepare_record(const std::string& prefix, int vocab) {
  const std::string path = prefix + ".json";
  std::ifstream in(path);
  if (!in) return;  // datasets from other tools have none
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::config, "data.path (format indexed): " + path + " is not JSON (" + e.what() + ")",
                "rewrite it with dtrain data prepare, or remove it (it only records the tokenizer)");
  }
  if (!j.is_object() || !j.contains("vocab_size") || !j["vocab_size"].is_number_integer())
    throw Error(ErrorCode::config, "data.path (format indexed): " + path + " has no integer vocab_size",
                "rewrite it with dtrain data prepare, or remove it (it only records the tokenizer)");
  const int64_t v = j["vocab_size"].get<int64_t>();
  if (v > vocab)
    throw Error(ErrorCode::config,
                "data.path (format indexed): " + path + ": the tokenizer" +
                    (j.contains("tokenizer") && j["tokenizer"].is_string() ? " " + j["tokenizer"].get<std::string>() : "") +
                    " has vocab_size " + std::to_string(v) + ", more than model.vocab = " + std::to_string(vocab),
                "set model.vocab >= " + std::to_string(v) + ", or prepare the data with the model's tokenizer");
}

}  // namespace

void check_indexed_dataset(const std::string& prefix, int vocab) {
  const IndexedHeader h = read_indexed_header(prefix);
  if (h.sequences > 0) {
    std::ifstream idx(h.idx_path, std::ios::binary);
    check_sequence_tokens(h, idx, 0, "first", vocab);
    if (h.sequences > 1) check_sequence_tokens(h, idx, h.sequences - 1, "last", vocab);
  }
  check_prepare_record(prefix, vocab);
}

}  // namespace dtrain
