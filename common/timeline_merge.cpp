// merge_to_chrome (timeline.h): the rank files of one traced run as one
// Chrome-trace JSON for ui.perfetto.dev or chrome://tracing. pid = rank;
// tracks (tid) per kind of work; every span a complete ("X") event whose
// timestamps are microseconds on rank 0's clock. Spans that overlap without
// nesting (async collectives in flight together) go to extra lanes of their
// track, since both viewers expect the slices of one thread to nest.
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/error.h"
#include "common/timeline.h"

namespace dtrain::timeline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

enum Track { kSteps = 0, kCompute, kPipeline, kCollectives, kTracks };
const char* kTrackNames[kTracks] = {"steps", "compute", "pipeline p2p", "collectives"};
constexpr int kLaneStride = 10;  // tid = track * stride + lane + 1

Track track_of(Kind k) {
  switch (k) {
    case Kind::step: return kSteps;
    case Kind::send_act: case Kind::recv_act: case Kind::send_grad: case Kind::recv_grad: return kPipeline;
    case Kind::collective: return kCollectives;
    default: return kCompute;
  }
}

// The plan's names (plan/pipeline_plan.cpp's format_action) for pipeline
// actions, so a trace reads like `dtrain topo --schedule`.
std::string span_name(const Span& s, int chunks) {
  const std::string m = std::to_string(s.micro) + (chunks > 1 && s.chunk >= 0 ? "." + std::to_string(s.chunk) : "");
  switch (s.kind) {
    case Kind::step: return "step " + std::to_string(s.step);
    case Kind::data: return "data " + std::to_string(s.micro);
    case Kind::forward: return "F" + m;
    case Kind::backward: return "B" + m;
    case Kind::backward_input: return "BI" + m;
    case Kind::backward_weight: return "W" + m;
    case Kind::send_act: return "SEND_F" + m;
    case Kind::recv_act: return "RECV_F" + m;
    case Kind::send_grad: return "SEND_B" + m;
    case Kind::recv_grad: return "RECV_B" + m;
    case Kind::collective: return std::string(s.op) + " " + s.group;
    default: return kind_name(s.kind);
  }
}

// Lanes of one track: a span joins the first lane where it nests in, or
// follows, what is open there.
class Lanes {
 public:
  int place(int64_t begin, int64_t end) {
    for (size_t i = 0;; ++i) {
      if (i == open_.size()) open_.emplace_back();
      auto& stack = open_[i];
      while (!stack.empty() && stack.back() <= begin) stack.pop_back();
      if (stack.empty() || end <= stack.back()) {
        stack.push_back(end);
        return int(i);
      }
    }
  }
  size_t count() const { return open_.size(); }

 private:
  std::vector<std::vector<int64_t>> open_;  // per lane, the ends of the open spans, innermost last
};

std::vector<RankFile> read_trace_dir(const std::string& log_dir) {
  const fs::path dir = fs::path(log_dir) / "trace";
  const std::string fix = "trace a run with log.trace.steps: [FROM, TO] and merge its log.dir";
  if (!fs::is_directory(dir))
    throw Error(ErrorCode::config, log_dir + " holds no timeline trace (" + dir.string() + " is not a directory)", fix);
  std::map<int, RankFile> files;
  static const std::regex name("rank_([0-9]+)\\.json");
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (!std::regex_match(file, m, name)) continue;
    RankFile f = read_rank_file(entry.path().string());
    if (f.info.rank != std::stoi(m[1]))
      throw Error(ErrorCode::config, entry.path().string() + " holds rank " + std::to_string(f.info.rank),
                  "the trace directory was edited; trace the run again");
    files.emplace(f.info.rank, std::move(f));
  }
  if (files.empty()) throw Error(ErrorCode::config, dir.string() + " holds no rank_<r>.json files", fix);
  const RankFile& first = files.begin()->second;
  std::string missing;
  for (int r = 0; r < first.info.world; ++r)
    if (!files.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  for (const auto& [r, f] : files)
    if (f.info.world != first.info.world || f.from != first.from || f.to != first.to || r >= first.info.world)
      throw Error(ErrorCode::config,
                  dir.string() + ": rank files of different runs (rank " + std::to_string(r) + ": world " +
                      std::to_string(f.info.world) + ", steps " + std::to_string(f.from) + "-" + std::to_string(f.to) +
                      "; rank " + std::to_string(first.info.rank) + ": world " + std::to_string(first.info.world) +
                      ", steps " + std::to_string(first.from) + "-" + std::to_string(first.to) + ")",
                  "remove the stale files, or trace the run again into an empty log.dir");
  if (!missing.empty())
    throw Error(ErrorCode::config,
                dir.string() + " lacks the files of rank(s) " + missing + " of " + std::to_string(first.info.world),
                "a rank stopped before the trace range ended; trace a range of steps the run completes");
  std::vector<RankFile> out;
  for (auto& [r, f] : files) out.push_back(std::move(f));
  return out;
}

// An async collective launched in the step before and waited for in this
// one (a span belongs to the step it ends in) is drawn from this step's
// begin; returns, per span, how much earlier it was launched (0: not).
std::vector<int64_t> clamp_to_steps(RankFile& f) {
  std::map<int, int64_t> step_begin;
  for (const Span& s : f.spans)
    if (s.kind == Kind::step) step_begin[s.step] = s.begin_ns;
  std::vector<int64_t> launched_before(f.spans.size(), 0);
  for (size_t i = 0; i < f.spans.size(); ++i) {
    Span& s = f.spans[i];
    const auto b = step_begin.find(s.step);
    if (s.kind == Kind::step || b == step_begin.end() || s.begin_ns >= b->second) continue;
    launched_before[i] = b->second - s.begin_ns;
    s.begin_ns = b->second;
  }
  return launched_before;
}

json span_args(const Span& s, const RankInfo& info) {
  json a = {{"step", s.step}};
  if (s.micro >= 0) a["micro"] = s.micro;
  if (s.kind != Kind::step && s.kind != Kind::collective && s.kind != Kind::optimizer &&
      s.kind != Kind::checkpoint && s.kind != Kind::grad_sync && s.kind != Kind::data)
    a["stage"] = info.pp_stage;
  if (s.chunk >= 0) a["chunk"] = s.chunk;
  if (s.kind == Kind::collective) {
    a["op"] = s.op;
    a["group"] = s.group;
    a["wait_us"] = double(s.wait_ns) / 1e3;
  }
  if (s.kind == Kind::collective || track_of(s.kind) == kPipeline) a["bytes"] = s.bytes;
  return a;
}

}  // namespace

std::string merge_to_chrome(const std::string& log_dir, MergeStats* stats) {
  std::vector<RankFile> files = read_trace_dir(log_dir);
  std::vector<std::vector<int64_t>> early;
  for (auto& f : files) early.push_back(clamp_to_steps(f));
  int64_t base = INT64_MAX;  // the earliest aligned begin: time 0 of the trace
  for (const auto& f : files)
    for (const Span& s : f.spans) base = std::min(base, s.begin_ns - f.info.offset_ns);
  json events = json::array();
  MergeStats st;
  for (auto& f : files) {
    const int pid = f.info.rank;
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid},
                      {"args", {{"name", "rank " + std::to_string(pid) + " (" + f.info.coords + ")"}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    const std::vector<int64_t>& launched_before = early[size_t(&f - files.data())];
    // Outer spans first, so an enclosing span opens its lane before what it holds.
    std::vector<size_t> order(f.spans.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const Span &x = f.spans[a], &y = f.spans[b];
      return x.begin_ns != y.begin_ns ? x.begin_ns < y.begin_ns : x.end_ns > y.end_ns;
    });
    Lanes lanes[kTracks];
    for (size_t i : order) {
      const Span& s = f.spans[i];
      const Track t = track_of(s.kind);
      const int tid = t * kLaneStride + lanes[t].place(s.begin_ns, s.end_ns) + 1;
      events.push_back({{"ph", "X"}, {"pid", pid}, {"tid", tid}, {"cat", kind_name(s.kind)},
                        {"name", span_name(s, f.info.chunks)},
                        {"ts", double(s.begin_ns - f.info.offset_ns - base) / 1e3},
                        {"dur", double(s.end_ns - s.begin_ns) / 1e3}, {"args", span_args(s, f.info)}});
      if (launched_before[i] > 0) events.back()["args"]["launched_before_step_us"] = double(launched_before[i]) / 1e3;
    }
    for (int t = 0; t < kTracks; ++t)
      for (size_t lane = 0; lane < lanes[t].count(); ++lane) {
        const int tid = t * kLaneStride + int(lane) + 1;
        const std::string name = std::string(kTrackNames[t]) + (lane ? " " + std::to_string(lane + 1) : "");
        events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
        events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", tid},
                          {"args", {{"sort_index", tid}}}});
      }
    st.ranks++;
    st.spans += f.spans.size();
    st.dropped += f.dropped;
  }
  json clock = json::array();
  for (const auto& f : files) clock.push_back({{"rank", f.info.rank}, {"offset_ns", f.info.offset_ns}, {"rtt_ns", f.info.rtt_ns}});
  json out = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"steps", {files[0].from, files[0].to}}, {"clock", std::move(clock)}}}};
  if (stats) *stats = st;
  return out.dump() + "\n";
}

}  // namespace dtrain::timeline
