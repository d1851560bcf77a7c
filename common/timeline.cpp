// The timeline recorder and its raw per-rank file (timeline.h). Recording is
// an atomic index into an array allocated at start(), so a span costs two
// clock reads and one 64-byte store; spans past the array are counted, not
// stored. The file is written once, after the range's last step.
#include "common/timeline.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "common/safe_output.h"

namespace dtrain::timeline {
namespace {

// Enough for a step's micro-batches, pipeline actions and per-layer tensor-
// parallel collectives; a rank that records more counts the rest as dropped.
constexpr size_t kSpansPerStep = 8192;
constexpr size_t kMaxSpans = size_t(1) << 20;  // 64 MiB

struct Recorder {
  Options options;
  std::vector<Span> spans;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> dropped{0};
  // Read by any thread that records (an autograd thread's gradient hooks
  // launch collectives); set by the training loop's thread.
  std::atomic<bool> on{false};  // the current step lies in the range
  std::atomic<int> step{0};
  int64_t step_begin = 0;
  bool written = false;
};

std::unique_ptr<Recorder>& the_recorder() {
  static std::unique_ptr<Recorder> r;
  return r;
}

void copy_name(char* dst, size_t size, const char* src) {
  std::strncpy(dst, src, size - 1);
  dst[size - 1] = '\0';
}

}  // namespace

const char* kind_name(Kind kind) {
  static const char* names[] = {"step",     "data",     "forward",   "backward",  "backward_input",
                                "backward_weight", "send_act", "recv_act", "send_grad", "recv_grad",
                                "collective", "grad_sync", "optimizer", "checkpoint"};
  return names[static_cast<int>(kind)];
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

void start(const Options& options) {
  auto r = std::make_unique<Recorder>();
  r->options = options;
  if (options.from <= options.to) {
    const size_t steps = size_t(options.to - options.from + 1);
    r->spans.resize(std::min(kMaxSpans, steps * kSpansPerStep));
  }
  the_recorder() = std::move(r);
}

void stop() { the_recorder().reset(); }

bool enabled() {
  const auto& r = the_recorder();
  return r && r->options.from <= r->options.to;
}

void set_offset(int64_t offset_ns, int64_t rtt_ns) {
  if (auto& r = the_recorder()) {
    r->options.info.offset_ns = offset_ns;
    r->options.info.rtt_ns = rtt_ns;
  }
}

bool recording() {
  const auto& r = the_recorder();
  return r && r->on.load(std::memory_order_relaxed);
}

void begin_step(int step) {
  auto& r = the_recorder();
  if (!r) return;
  const bool on = step >= r->options.from && step <= r->options.to;
  r->step = step;
  r->step_begin = on ? now_ns() : 0;
  r->on = on;
}

std::string end_step() {
  auto& r = the_recorder();
  if (!r || !r->on) return {};
  record(Kind::step, r->step_begin);
  r->on = false;
  if (r->step != r->options.to || r->written) return {};
  RankFile file;
  file.info = r->options.info;
  file.from = r->options.from;
  file.to = r->options.to;
  const size_t n = std::min(r->next.load(), r->spans.size());
  file.spans.assign(r->spans.begin(), r->spans.begin() + ptrdiff_t(n));
  file.dropped = r->dropped.load();
  const std::string path = rank_file_path(r->options.dir, file.info.rank);
  write_rank_file(path, file);
  r->written = true;
  if (file.dropped > 0)
    DTRAIN_WARN("log.trace: {} spans did not fit the trace's {} and are missing from {}", file.dropped,
                r->spans.size(), path);
  return path;
}

void record(const Span& span) {
  Recorder* r = the_recorder().get();
  if (!r || !r->on.load(std::memory_order_relaxed)) return;
  const size_t i = r->next.fetch_add(1, std::memory_order_relaxed);
  if (i >= r->spans.size()) {
    r->dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  r->spans[i] = span;
  r->spans[i].step = r->step.load(std::memory_order_relaxed);
}

void record(Kind kind, int64_t begin_ns, int micro, int chunk, uint64_t bytes) {
  if (!recording()) return;
  Span s;
  s.kind = kind;
  s.begin_ns = begin_ns;
  s.end_ns = now_ns();
  s.micro = int16_t(micro);
  s.chunk = int16_t(chunk);
  s.bytes = bytes;
  record(s);
}

void record_collective(const char* op, const std::string& group, uint64_t bytes, int64_t begin_ns,
                       int64_t wait_ns) {
  if (!recording()) return;
  Span s;
  s.kind = Kind::collective;
  s.begin_ns = begin_ns;
  s.end_ns = now_ns();
  s.wait_ns = wait_ns;
  s.bytes = bytes;
  copy_name(s.op, sizeof s.op, op);
  copy_name(s.group, sizeof s.group, group.c_str());
  record(s);
}

std::string rank_file_path(const std::string& trace_dir, int rank) {
  return trace_dir + "/rank_" + std::to_string(rank) + ".json";
}

// Spans are rows [kind, begin, end, wait, bytes, step, micro, chunk, op, group]:
// a compact file, read only by the merge.
void write_rank_file(const std::string& path, const RankFile& f) {
  nlohmann::json j;
  j["format"] = "dtrain-timeline-1";
  j["rank"] = f.info.rank;
  j["world"] = f.info.world;
  j["coords"] = f.info.coords;
  j["pp_stage"] = f.info.pp_stage;
  j["chunks"] = f.info.chunks;
  j["offset_ns"] = f.info.offset_ns;
  j["rtt_ns"] = f.info.rtt_ns;
  j["steps"] = {f.from, f.to};
  j["dropped"] = f.dropped;
  nlohmann::json rows = nlohmann::json::array();
  for (const Span& s : f.spans)
    rows.push_back({kind_name(s.kind), s.begin_ns, s.end_ns, s.wait_ns, s.bytes, s.step, s.micro, s.chunk,
                    std::string(s.op), std::string(s.group)});
  j["spans"] = std::move(rows);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  write_file_safely(path, j.dump() + "\n", "log.trace's rank file", Clobber::replace);
}

namespace {

Kind kind_from(const std::string& name, const std::string& path) {
  for (int k = 0; k <= static_cast<int>(Kind::checkpoint); ++k)
    if (name == kind_name(static_cast<Kind>(k))) return static_cast<Kind>(k);
  throw Error(ErrorCode::config, path + ": unknown span kind \"" + name + "\"",
              "the file was not written by this dtrain; trace the run again");
}

}  // namespace

RankFile read_rank_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::config, path + " cannot be read", "check the file's permissions");
  RankFile f;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.value("format", "") != "dtrain-timeline-1")
      throw Error(ErrorCode::config, path + " is not a dtrain timeline file (no format dtrain-timeline-1)",
                  "give the log.dir of a run traced with log.trace.steps");
    f.info.rank = j.at("rank").get<int>();
    f.info.world = j.at("world").get<int>();
    f.info.coords = j.at("coords").get<std::string>();
    f.info.pp_stage = j.at("pp_stage").get<int>();
    f.info.chunks = j.at("chunks").get<int>();
    f.info.offset_ns = j.at("offset_ns").get<int64_t>();
    f.info.rtt_ns = j.at("rtt_ns").get<int64_t>();
    f.from = j.at("steps").at(0).get<int>();
    f.to = j.at("steps").at(1).get<int>();
    f.dropped = j.at("dropped").get<uint64_t>();
    for (const auto& row : j.at("spans")) {
      Span s;
      s.kind = kind_from(row.at(0).get<std::string>(), path);
      s.begin_ns = row.at(1).get<int64_t>();
      s.end_ns = row.at(2).get<int64_t>();
      s.wait_ns = row.at(3).get<int64_t>();
      s.bytes = row.at(4).get<uint64_t>();
      s.step = row.at(5).get<int32_t>();
      s.micro = row.at(6).get<int16_t>();
      s.chunk = row.at(7).get<int16_t>();
      copy_name(s.op, sizeof s.op, row.at(8).get<std::string>().c_str());
      copy_name(s.group, sizeof s.group, row.at(9).get<std::string>().c_str());
      f.spans.push_back(s);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::config, path + " is not a valid dtrain timeline file: " + e.what(),
                "the run may have stopped while writing it; trace the run again");
  }
  return f;
}

}  // namespace dtrain::timeline
