// TensorBoardWriter (tensorboard.h) and its hand-written protobuf encoder.
// Why by hand: no C++ event-file writer is packaged (Debian, PyPI), and
// compiling our own .proto would link libprotobuf into the engine beside the
// copy LibTorch carries (two protobuf runtimes in one process collide on their
// descriptor pools). The messages needed are five, with scalar fields and
// nested messages only: varint, fixed64, fixed32 and length-delimited fields
// suffice. Field numbers are tensorflow's (event.proto, summary.proto,
// tensor.proto), which tensorboard.compat.proto repeats.
#include "common/tensorboard.h"

#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/crc32c.h"
#include "common/error.h"
#include "common/log.h"

namespace dtrain::tb {
namespace detail {
namespace {

static_assert(std::endian::native == std::endian::little, "fixed-width fields are written in host order");

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

// Field numbers of the messages written.
enum EventField : uint32_t { kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7 };
constexpr uint32_t kSummaryValue = 1;                                    // Summary.value
enum ValueField : uint32_t { kTag = 1, kSimpleValue = 2, kTensor = 8, kMetadata = 9 };  // Summary.Value
constexpr uint32_t kPluginData = 1, kPluginName = 1;                     // SummaryMetadata, its PluginData
enum TensorField : uint32_t { kDtype = 1, kTensorShape = 2, kStringVal = 8 };  // TensorProto
constexpr uint64_t kDtString = 7;                                        // DataType DT_STRING
constexpr uint32_t kSessionStatus = 1;                                   // SessionLog.status
constexpr uint64_t kSessionStart = 1;                                    // SessionLog.START

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += char(uint8_t(v) | 0x80);
    v >>= 7;
  }
  out += char(uint8_t(v));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, uint64_t(field) << 3 | type); }

void put_uint(std::string& out, uint32_t field, uint64_t v) {  // int64 and enums: negative as 10 bytes
  put_key(out, field, kVarint);
  put_varint(out, v);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {  // strings and messages
  put_key(out, field, kBytes);
  put_varint(out, bytes.size());
  out.append(bytes);
}

template <typename T>
void put_fixed(std::string& out, uint32_t field, T v) {  // double: fixed64, float: fixed32
  put_key(out, field, sizeof(T) == 8 ? kFixed64 : kFixed32);
  char raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));
  out.append(raw, sizeof(T));
}

// Event's common head: wall_time and step, each left out at 0 as proto3 does.
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  if (wall_time != 0) put_fixed(e, kWallTime, wall_time);
  if (step != 0) put_uint(e, kStep, uint64_t(step));
  return e;
}

void flatten(const nlohmann::json& j, const std::string& prefix, std::vector<std::pair<std::string, float>>& out) {
  for (const auto& [key, v] : j.items()) {
    const std::string tag = prefix.empty() ? key : prefix + "/" + key;
    if (v.is_object()) flatten(v, tag, out);
    else if (v.is_number() && !(prefix.empty() && key == "step")) out.emplace_back(tag, v.get<float>());
  }
}

}  // namespace

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data.data(), data.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  const uint64_t length = data.size();
  char head[8];
  std::memcpy(head, &length, 8);
  const uint32_t crcs[2] = {masked_crc32c({head, 8}), masked_crc32c(data)};
  std::string out(head, 8);
  out.append(reinterpret_cast<const char*>(&crcs[0]), 4);
  out.append(data);
  out.append(reinterpret_cast<const char*>(&crcs[1]), 4);
  return out;
}

std::string version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, kFileVersion, "brain.Event:2");
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    put_bytes(v, kTag, tag);
    put_fixed(v, kSimpleValue, value);  // a oneof member: written even when 0
    put_bytes(summary, kSummaryValue, v);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, kSummary, summary);
  return e;
}

std::string text_event(double wall_time, int64_t step, std::string_view tag, std::string_view text) {
  std::string plugin, metadata, tensor, value, summary;
  put_bytes(plugin, kPluginName, "text");  // content: TextPluginData{version 0}, all default: empty
  put_bytes(metadata, kPluginData, plugin);
  put_uint(tensor, kDtype, kDtString);
  put_bytes(tensor, kTensorShape, "");  // a scalar: a shape with no dims
  put_bytes(tensor, kStringVal, text);
  put_bytes(value, kTag, tag);
  put_bytes(value, kTensor, tensor);
  put_bytes(value, kMetadata, metadata);
  put_bytes(summary, kSummaryValue, value);
  std::string e = event_head(wall_time, step);
  put_bytes(e, kSummary, summary);
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string log;
  put_uint(log, kSessionStatus, kSessionStart);
  std::string e = event_head(wall_time, step);
  put_bytes(e, kSessionLog, log);
  return e;
}

std::vector<std::pair<std::string, float>> record_scalars(const std::string& jsonl_line, int64_t* step) {
  const nlohmann::json j = nlohmann::json::parse(jsonl_line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
    throw Error(ErrorCode::internal, "a metrics record is not a JSON object with an integer \"step\": " + jsonl_line,
                "this is a dtrain bug; set log.tensorboard: false to train without event files");
  *step = j["step"].get<int64_t>();
  std::vector<std::pair<std::string, float>> out;
  flatten(j, "", out);
  return out;
}

}  // namespace detail

namespace {

double wall_time_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "localhost";
  return buf;
}

// The spec as Markdown: indented four spaces, a code block, so that YAML's
// indentation and '#' comments are shown as written.
std::string markdown_code(const std::string& text) {
  std::string out = "    ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "    ";
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step, bool fresh,
                                     const std::string& spec_yaml) {
  const double now = wall_time_s();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // TensorFlow's name: readers pick event files by the prefix and read them in name order.
  path_ = dir + "/events.out.tfevents." + std::to_string(int64_t(now)) + "." + host_name() + "." +
          std::to_string(::getpid());
  file_ = ec ? nullptr : std::fopen(path_.c_str(), "wb");
  if (!file_)
    throw Error(ErrorCode::config, "cannot write the TensorBoard event file " + path_,
                "check that log.dir is a writable directory, or set log.tensorboard: false");
  write(detail::version_event(now));
  // Earlier files' events from here on are superseded: a fresh run replaces
  // everything (step 0 on), a resume the steps after its checkpoint.
  const int64_t from = fresh ? 0 : first_step + 1;
  write(detail::session_start_event(now, from));
  if (!spec_yaml.empty()) write(detail::text_event(now, from, "spec", markdown_code(spec_yaml)));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_record(const std::string& jsonl_line) {
  int64_t step = 0;
  const auto values = detail::record_scalars(jsonl_line, &step);
  write(detail::scalars_event(wall_time_s(), step, values));
}

void TensorBoardWriter::write(const std::string& event) {
  if (failed_) return;
  const std::string record = detail::tfrecord(event);
  // Flushed per record: a crash loses nothing already logged.
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0) {
    failed_ = true;
    DTRAIN_WARN("cannot write the TensorBoard event file {} ({}); training goes on without it", path_,
                std::strerror(errno));
  }
}

}  // namespace dtrain::tb
