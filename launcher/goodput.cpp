// Goodput (see goodput.h). Time between attempts is start-up before the
// launch's first attempt and restart after it; inside an attempt the lead-in
// to the first step goes the same way, the trace's step and save sums are
// counted, and idle is what is left, so the causes always add up to the wall.
#include "launcher/goodput.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/log.h"

namespace dtrain::launcher {

namespace {

constexpr const char* kNames[] = {"productive", "redone", "checkpoint", "restart", "startup", "eval", "idle"};

double* field(GoodputSeconds& s, int i) {
  double* f[] = {&s.productive, &s.redone, &s.checkpoint, &s.restart, &s.startup, &s.eval, &s.idle};
  return f[i];
}
double value(const GoodputSeconds& s, int i) { return *field(const_cast<GoodputSeconds&>(s), i); }

nlohmann::json to_json(const GoodputSeconds& s) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < 7; ++i) j[kNames[i]] = value(s, i);
  return j;
}

GoodputSeconds seconds_from_json(const nlohmann::json& j) {
  GoodputSeconds s;
  for (int i = 0; i < 7; ++i)
    if (j.is_object() && j.contains(kNames[i]) && j[kNames[i]].is_number()) *field(s, i) = j[kNames[i]].get<double>();
  return s;
}

// eval_ms of the complete metrics.jsonl lines after *offset, summed (s);
// *offset moves past them. A file shorter than *offset was restarted.
double eval_seconds_after(const std::string& path, int64_t* offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return 0;
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  if (size < *offset) *offset = 0;
  in.seekg(*offset);
  std::string text(size_t(size - *offset), '\0');
  in.read(text.data(), std::streamsize(text.size()));
  double total = 0;
  size_t from = 0;
  for (size_t nl; (nl = text.find('\n', from)) != std::string::npos; from = nl + 1) {
    const size_t at = text.find("\"eval_ms\":", from);
    if (at != std::string::npos && at < nl) total += std::strtod(text.c_str() + at + 10, nullptr) * 1e-3;
  }
  *offset += int64_t(from);
  return total;
}

int64_t file_size(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  return in ? int64_t(in.tellg()) : 0;
}

}  // namespace

GoodputSeconds& GoodputSeconds::operator+=(const GoodputSeconds& o) {
  for (int i = 0; i < 7; ++i) *field(*this, i) += value(o, i);
  return *this;
}

GoodputSeconds account_attempt(const GoodputAttempt& a, double end, int64_t high_water) {
  GoodputSeconds s;
  const double window = std::max(0.0, end - a.spawned);
  double& lead = a.first ? s.startup : s.restart;
  const trace::RankProgress& p = a.rank0;
  if (!a.has_trace || p.first_step_ns == 0) {
    lead = window;  // no step began: all of it was getting there
    return s;
  }
  lead = std::clamp(double(p.first_step_ns) * 1e-9 - a.spawned, 0.0, window);
  const int64_t steps = p.done_step - p.start_step;
  const double step_s = double(p.step_ns) * 1e-9;
  if (steps > 0) {
    const int64_t redone = std::clamp<int64_t>(std::min(p.done_step, high_water) - p.start_step, 0, steps);
    s.redone = step_s * double(redone) / double(steps);
    s.productive = step_s - s.redone;
  }
  s.checkpoint = double(p.checkpoint_ns) * 1e-9;
  s.eval = a.eval_s;
  s.idle = std::max(0.0, window - s.sum());
  return s;
}

Goodput::Goodput(std::string run_dir, double now, bool tensorboard) : run_dir_(std::move(run_dir)) {
  seg_.start = seg_.end = gap_start_ = now;
  read_earlier();
  // From the highest step so far on: an earlier launch's events stay.
  if (tensorboard) {
    try {
      tensorboard_ = std::make_unique<tb::TensorBoardWriter>(run_dir_ + "/tb/goodput", high_water_, false, "");
    } catch (const Error& e) {
      DTRAIN_WARN("goodput: {}; goodput.json is still written", e.message());
    }
  }
}

void Goodput::read_earlier() {
  std::ifstream in(path());
  if (!in) return;
  std::stringstream text;
  text << in.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("segments") || !j["segments"].is_array()) {
    DTRAIN_WARN("goodput: {} is not a goodput file; starting it again", path());
    return;
  }
  for (const auto& s : j["segments"]) {
    Segment e;
    e.start = s.value("start", 0.0);
    e.end = s.value("end", 0.0);
    e.attempts = s.value("attempts", 0);
    e.first_step = s.value("first_step", int64_t(0));
    e.last_step = s.value("last_step", int64_t(0));
    e.seconds = seconds_from_json(s.value("seconds", nlohmann::json::object()));
    high_water_ = std::max(high_water_, e.last_step);
    earlier_.push_back(e);
  }
}

void Goodput::started(double now) {
  // The gap since the launch or the last attempt.
  (seg_.attempts == 0 ? seg_.seconds.startup : seg_.seconds.restart) += std::max(0.0, now - gap_start_);
  attempt_ = GoodputAttempt{};
  attempt_.spawned = now;
  attempt_.first = seg_.attempts == 0;
  ++seg_.attempts;
  running_ = true;
  metrics_offset_ = file_size(run_dir_ + "/metrics.jsonl");
  write(now);
}

void Goodput::read_trace_and_metrics() {
  trace::RankProgress p;
  if (trace::read_progress(trace::trace_path(run_dir_, 0), &p) && p.rank == 0) {
    attempt_.rank0 = p;
    attempt_.has_trace = true;
    if (seg_.attempts == 1 && seg_.first_step == 0 && seg_.last_step == 0) seg_.first_step = p.start_step;
    seg_.last_step = std::max(seg_.last_step, p.done_step);
  }
  attempt_.eval_s += eval_seconds_after(run_dir_ + "/metrics.jsonl", &metrics_offset_);
}

void Goodput::observe(double now) {
  if (!running_) return;
  read_trace_and_metrics();
  write(now);
}

void Goodput::ended(double now) {
  if (!running_) return;
  read_trace_and_metrics();
  seg_.seconds += account_attempt(attempt_, now, high_water_);
  if (attempt_.has_trace) high_water_ = std::max(high_water_, attempt_.rank0.done_step);
  running_ = false;
  gap_start_ = now;
  write(now);
}

void Goodput::finish(double now) {
  ended(now);
  // After the last attempt: leaving, waiting for the other nodes.
  (seg_.attempts == 0 ? seg_.seconds.startup : seg_.seconds.idle) += std::max(0.0, now - gap_start_);
  gap_start_ = now;
  write(now);
}

GoodputSeconds Goodput::totals(double now) const {
  GoodputSeconds t;
  for (const auto& e : earlier_) t += e.seconds;
  t += seg_.seconds;
  if (running_) t += account_attempt(attempt_, now, high_water_);
  else (seg_.attempts == 0 ? t.startup : t.idle) += std::max(0.0, now - gap_start_);
  return t;
}

void Goodput::write(double now) {
  GoodputSeconds current = seg_.seconds;
  if (running_) current += account_attempt(attempt_, now, high_water_);
  else (seg_.attempts == 0 ? current.startup : current.idle) += std::max(0.0, now - gap_start_);
  nlohmann::json segments = nlohmann::json::array();
  double wall = 0;
  auto add = [&](const Segment& e, double end, const GoodputSeconds& s) {
    wall += end - e.start;
    segments.push_back({{"start", e.start}, {"end", end}, {"wall_s", end - e.start}, {"attempts", e.attempts},
                        {"first_step", e.first_step}, {"last_step", e.last_step}, {"seconds", to_json(s)}});
  };
  for (const auto& e : earlier_) add(e, e.end, e.seconds);
  add(seg_, now, current);
  const GoodputSeconds t = totals(now);
  nlohmann::json j = {{"wall_s", wall}, {"goodput", wall > 0 ? t.productive / wall : 0.0},
                      {"seconds", to_json(t)}, {"segments", segments}};
  // A new file renamed over the old: a reader never sees half of one.
  const std::string tmp = path() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    if (!out) {
      DTRAIN_WARN("goodput: cannot write {}", tmp);
      return;
    }
  }
  if (std::rename(tmp.c_str(), path().c_str()) != 0) DTRAIN_WARN("goodput: cannot replace {}", path());
  if (tensorboard_) {
    nlohmann::json record = {{"step", std::max(high_water_, seg_.last_step)}, {"goodput", j["goodput"]},
                             {"wall_s", wall}, {"seconds", j["seconds"]}};
    tensorboard_->add_record(record.dump());
  }
}

std::string Goodput::table(double now) const {
  const GoodputSeconds t = totals(now);
  double wall = now - seg_.start;
  for (const auto& e : earlier_) wall += e.end - e.start;
  std::string out = fmt::format("goodput {:.1f}% of {:.1f} s wall ({} launch(es); {}):\n",
                                wall > 0 ? 100.0 * t.productive / wall : 0.0, wall, earlier_.size() + 1, path());
  for (int i = 0; i < 7; ++i)
    out += fmt::format("  {:<11} {:>10.2f} s  {:5.1f}%\n", kNames[i], value(t, i),
                       wall > 0 ? 100.0 * value(t, i) / wall : 0.0);
  return out;
}

}  // namespace dtrain::launcher
