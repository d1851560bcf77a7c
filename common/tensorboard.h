// TensorBoard event files (log.tensorboard): rank 0 mirrors every metrics.jsonl
// record as scalars into <log dir>/tb/events.out.tfevents.<time>.<host>.<pid>,
// which stock TensorBoard reads; node 0's agent writes goodput into tb/goodput/. Owns the file format only: TFRecord framing
// (length, masked CRC32C of it, data, masked CRC32C of the data) around
// Event/Summary protobuf messages that tb::detail encodes by field number.
// Not here: what goes into a record (engine/trainer/metrics.cpp,
// launcher/goodput.cpp), LibTorch, Python.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::tb {

namespace detail {

// The CRC TFRecord stores: CRC32C rotated right 15 bits plus a constant, so
// that a CRC of data that itself holds CRCs does not degenerate.
uint32_t masked_crc32c(std::string_view data);
// One TFRecord: uint64 length (little-endian), masked CRC of those 8 bytes,
// the data, masked CRC of the data.
std::string tfrecord(std::string_view data);

// Serialized tensorflow.Event messages (proto3: fields at their default are
// left out, as protobuf's own serializer does).
std::string version_event(double wall_time);  // file_version "brain.Event:2"
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values);
// A string tensor summary with plugin "text" (TensorBoard's text plugin;
// the text is rendered as Markdown).
std::string text_event(double wall_time, int64_t step, std::string_view tag, std::string_view text);
// SessionLog START at `step`: readers drop every event of earlier files at
// step >= `step` (the steps a restarted or fresh run writes again).
std::string session_start_event(double wall_time, int64_t step);

// The scalars of one metrics.jsonl record: every number, tagged by its key
// ("key/sub" inside objects); "step" and non-numbers (strings, booleans,
// null) left out. Throws dtrain::Error when the line is not a JSON object.
std::vector<std::pair<std::string, float>> record_scalars(const std::string& jsonl_line, int64_t* step);

}  // namespace detail

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it. `first_step`: the step before
  // the first one this run logs (0 fresh, the checkpoint's step on resume);
  // earlier files' events from the next step on are superseded. A fresh run
  // (`fresh`) also gets `spec_yaml` as text "spec" at step 0; a resume at
  // first_step + 1. Throws dtrain::Error when the file cannot be created.
  TensorBoardWriter(const std::string& dir, int64_t first_step, bool fresh, const std::string& spec_yaml);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One metrics.jsonl record (its text): its scalars at its step, flushed.
  void add_record(const std::string& jsonl_line);
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
  bool failed_ = false;  // a write failed: warned once, writing stopped (training goes on)
};

}  // namespace dtrain::tb
