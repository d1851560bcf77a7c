// MetricsLogger (metrics.h): interval timing, the console line and the JSONL
// record. Losses go to the file with 17 significant digits so parity tests can
// compare runs at full double precision.
#include "engine/trainer/metrics.h"

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/log.h"
#include "common/tensorboard.h"

namespace dtrain::engine::trainer {
namespace {

// This process's CPU time (user + system, every thread) in seconds: with
// elapsed_s it says how much of a step was work and how much waiting.
double process_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", double(bytes) / (1 << 20)); }

std::string duration_text(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  auto total = static_cast<int64_t>(std::llround(s));
  if (total >= 3600) return fmt::format("{}h{:02d}m", total / 3600, (total / 60) % 60);
  return fmt::format("{}m{:02d}s", total / 60, total % 60);
}

// A JSON number with `digits` significant digits, or null for NaN and inf
// (which JSON cannot hold).
std::string num(double v, int digits) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

}  // namespace

std::string json_escaped(const std::string& name) {
  std::string key;
  for (unsigned char c : name)
    key += c == '"' || c == '\\' ? std::string("\\") + char(c)
           : c < 0x20            ? fmt::format("\\u{:04x}", c)
                                 : std::string(1, char(c));
  return key;
}

std::string MetricsLogger::jsonl_line(const StepReport& r, const MemoryStats& mem, const Timing& t) const {
  std::string line = fmt::format(
      "{{\"step\": {}, \"loss\": {}, \"lr\": {}, \"tokens_per_s\": {}, \"elapsed_s\": {}, \"cpu_s\": {}, "
      "\"step_time_s\": {}, \"sync_wait_s\": {}, \"grad_norm\": {}, \"rss_bytes\": {}, \"param_bytes\": {}, "
      "\"grad_bytes\": {}, \"optimizer_bytes\": {}, \"peak_bytes\": {}, \"shm_bytes\": {}, "
      "\"buckets_in_backward\": {}, \"dp_bytes_sent\": {}, \"tp_bytes_sent\": {}, \"slowest_rank\": {}, "
      "\"straggler_ratio\": {}, \"mfu\": {}, \"flops_per_step\": {}, \"peak_flops\": {}",
      r.step, num(r.loss, 17), num(r.lr, 17), num(t.tokens_per_s, 6), num(t.elapsed_s, 6), num(t.cpu_s, 6),
      num(t.step_s, 6), num(t.wait_s, 6), num(r.grad_norm, 9), mem.rss, mem.params, mem.grads, mem.optimizer,
      mem.peak, mem.shm, r.buckets_in_backward, r.dp_bytes_sent, r.tp_bytes_sent, r.slowest_rank,
      num(r.straggler_ratio, 6), num(t.mfu, 9), num(opt_.flops_per_step, 17), num(opt_.peak_flops, 17));
  if (r.live_peak_flops > 0)
    line += ", \"peak_flops_live\": " + num(r.live_peak_flops, 17) + ", \"mfu_live\": " + num(t.mfu_live, 9);
  for (const auto& [name, value] : r.extra) line += ", \"" + name + "\": " + num(value, 9);
  if (r.evaluated)
    line += ", \"val_loss\": " + num(r.val_loss, 17) + ", \"val_ppl\": " + num(r.val_ppl, 17) +
            ", \"eval_ms\": " + num(r.eval_ms, 6);
  if (r.evaluated && !r.val_loss_by_source.empty()) {
    line += ", \"val_loss_by_source\": {";
    for (size_t i = 0; i < r.val_loss_by_source.size(); ++i)
      line += (i ? ", \"" : "\"") + json_escaped(r.val_loss_by_source[i].first) +
              "\": " + num(r.val_loss_by_source[i].second, 17);
    line += "}";
  }
  if (r.nonfinite) line += ", \"nonfinite\": true";
  if (!r.data_tokens.empty()) {
    line += ", \"data_tokens\": {";
    for (size_t i = 0; i < r.data_tokens.size(); ++i)
      line += (i ? ", \"" : "\"") + json_escaped(r.data_tokens[i].first) + "\": " +
              std::to_string(r.data_tokens[i].second);
    line += "}";
  }
  // Which path each mesh axis's collectives take (shm, gloo, nccl).
  line += ", \"comm_path\": {";
  for (size_t i = 0; i < opt_.comm_paths.size(); ++i)
    line += (i ? ", \"" : "\"") + opt_.comm_paths[i].first + "\": \"" + opt_.comm_paths[i].second + "\"";
  return line + "}}\n";
}

int64_t process_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;  // pages
  return resident * sysconf(_SC_PAGESIZE);
}

MetricsLogger::MetricsLogger(MetricsOptions options) : opt_(std::move(options)), start_s_(now_s()) {
  if (opt_.every < 1) opt_.every = 1;
  if (!opt_.tensorboard_dir.empty())
    tensorboard_ = std::make_unique<tb::TensorBoardWriter>(opt_.tensorboard_dir, opt_.start_step, opt_.truncate,
                                                       opt_.spec_yaml);
  if (opt_.jsonl_path.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(opt_.jsonl_path).parent_path(), ec);
  jsonl_ = std::fopen(opt_.jsonl_path.c_str(), opt_.truncate ? "w" : "a");
  if (!jsonl_)
    throw Error(ErrorCode::config, "cannot write metrics file " + opt_.jsonl_path,
                "check that log.dir is a writable directory");
}

MetricsLogger::~MetricsLogger() {
  if (jsonl_) std::fclose(jsonl_);
}

bool MetricsLogger::should_log(int64_t step) const {
  // Step 1 too: the curve starts at the untrained loss (about ln V).
  return step == 1 || step % opt_.every == 0 || step == opt_.total_steps;
}

void MetricsLogger::record(const StepReport& r, const MemoryStats& mem, bool print) {
  interval_s_ += r.step_s;
  interval_wait_s_ += r.sync_wait_s;
  ++interval_steps_;
  if (!should_log(r.step) && !r.nonfinite && !r.evaluated) return;  // non-finite, evaluated: always logged
  const double step_s = interval_s_ / double(interval_steps_);
  const double tokens_per_s = double(opt_.tokens_per_step) / step_s;
  const double wait_s = interval_wait_s_ / double(interval_steps_);
  const double elapsed = now_s() - start_s_;
  const double eta = step_s * double(opt_.total_steps - r.step);
  // Model FLOPs utilisation of the interval's mean step (mfu.h).
  const double mfu = opt_.peak_flops > 0 ? opt_.flops_per_step / step_s / opt_.peak_flops : 0.0;
  const double mfu_live = r.live_peak_flops > 0 ? opt_.flops_per_step / step_s / r.live_peak_flops : 0.0;
  interval_s_ = interval_wait_s_ = 0;
  interval_steps_ = 0;
  if (!print) return;

  DTRAIN_INFO(
      "step {}/{} | loss {:.4f}{} | lr {:.2e} | {:.0f} tok/s | MFU {:.2f}%{} | {:.0f} ms/step (comm wait {:.1f} ms) | "
      "ETA {} | mem rss {}, params {}, grads {}, optim {}, step peak {}",
      r.step, opt_.total_steps, r.loss,
      r.evaluated ? fmt::format(" | val_loss {:.4f} (ppl {:.2f}, {:.0f} ms)", r.val_loss, r.val_ppl, r.eval_ms)
                  : std::string(),
      r.lr, tokens_per_s, mfu * 100,
      r.live_peak_flops > 0 ? fmt::format(" (live peak {:.2f}%)", mfu_live * 100) : std::string(), step_s * 1e3,
      wait_s * 1e3,
      duration_text(eta), mib(mem.rss), mib(mem.params), mib(mem.grads), mib(mem.optimizer),
      mib(mem.peak));
  if (!r.extra.empty()) {
    std::string line;
    for (const auto& [name, value] : r.extra) line += fmt::format("{}{} {:.4g}", line.empty() ? "" : " | ", name, value);
    DTRAIN_INFO("step {}/{} | {}", r.step, opt_.total_steps, line);
  }
  const std::string line = jsonl_line(r, mem, {tokens_per_s, elapsed, process_cpu_s(), step_s, wait_s, mfu, mfu_live});
  if (jsonl_) {
    std::fputs(line.c_str(), jsonl_);
    std::fflush(jsonl_);
  }
  if (tensorboard_) tensorboard_->add_record(line);
}

void MetricsLogger::record_checkpoint(int64_t step, double block_ms, double write_ms, double memory_copy_ms,
                                      bool print) {
  if (!print) return;
  std::string line = fmt::format("{{\"step\": {}, \"ckpt_block_ms\": {:.3f}", step, block_ms);
  if (write_ms >= 0) line += fmt::format(", \"ckpt_write_ms\": {:.3f}", write_ms);
  if (memory_copy_ms >= 0) line += fmt::format(", \"memory_copy_ms\": {:.3f}", memory_copy_ms);
  line += "}\n";
  if (jsonl_) {
    std::fputs(line.c_str(), jsonl_);
    std::fflush(jsonl_);
  }
  if (tensorboard_) tensorboard_->add_record(line);
}

}  // namespace dtrain::engine::trainer
