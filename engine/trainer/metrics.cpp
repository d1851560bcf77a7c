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

}  // namespace

int64_t process_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;  // pages
  return resident * sysconf(_SC_PAGESIZE);
}

MetricsLogger::MetricsLogger(MetricsOptions options) : opt_(std::move(options)), start_s_(now_s()) {
  if (opt_.every < 1) opt_.every = 1;
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
  if (!should_log(r.step)) return;
  const double step_s = interval_s_ / double(interval_steps_);
  const double tokens_per_s = double(opt_.tokens_per_step) / step_s;
  const double wait_s = interval_wait_s_ / double(interval_steps_);
  const double elapsed = now_s() - start_s_;
  const double eta = step_s * double(opt_.total_steps - r.step);
  // Model FLOPs utilisation of the interval's mean step (mfu.h).
  const double mfu = opt_.peak_flops > 0 ? opt_.flops_per_step / step_s / opt_.peak_flops : 0.0;
  interval_s_ = interval_wait_s_ = 0;
  interval_steps_ = 0;
  if (!print) return;

  DTRAIN_INFO(
      "step {}/{} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s | MFU {:.2f}% | {:.0f} ms/step (comm wait {:.1f} ms) | "
      "ETA {} | mem rss {}, params {}, grads {}, optim {}, step peak {}",
      r.step, opt_.total_steps, r.loss, r.lr, tokens_per_s, mfu * 100, step_s * 1e3, wait_s * 1e3,
      duration_text(eta), mib(mem.rss), mib(mem.params), mib(mem.grads), mib(mem.optimizer),
      mib(mem.peak));
  if (!r.extra.empty()) {
    std::string line;
    for (const auto& [name, value] : r.extra) line += fmt::format("{}{} {:.4g}", line.empty() ? "" : " | ", name, value);
    DTRAIN_INFO("step {}/{} | {}", r.step, opt_.total_steps, line);
  }
  if (jsonl_) {
    std::fprintf(jsonl_,
                 "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.17g, \"tokens_per_s\": %.6g, "
                 "\"elapsed_s\": %.6g, \"cpu_s\": %.6g, \"step_time_s\": %.6g, \"sync_wait_s\": %.6g, "
                 "\"grad_norm\": %.9g, \"rss_bytes\": %lld, \"param_bytes\": %lld, "
                 "\"grad_bytes\": %lld, \"optimizer_bytes\": %lld, \"peak_bytes\": %lld, "
                 "\"buckets_in_backward\": %d, \"dp_bytes_sent\": %lld, \"tp_bytes_sent\": %lld, "
                 "\"slowest_rank\": %d, \"straggler_ratio\": %.6g, "
                 "\"mfu\": %.9g, \"flops_per_step\": %.17g, \"peak_flops\": %.17g",
                 static_cast<long long>(r.step), r.loss, r.lr, tokens_per_s, elapsed, process_cpu_s(), step_s, wait_s,
                 r.grad_norm, static_cast<long long>(mem.rss), static_cast<long long>(mem.params),
                 static_cast<long long>(mem.grads), static_cast<long long>(mem.optimizer),
                 static_cast<long long>(mem.peak), r.buckets_in_backward,
                 static_cast<long long>(r.dp_bytes_sent), static_cast<long long>(r.tp_bytes_sent),
                 r.slowest_rank, r.straggler_ratio, mfu, opt_.flops_per_step, opt_.peak_flops);
    for (const auto& [name, value] : r.extra) std::fprintf(jsonl_, ", \"%s\": %.9g", name.c_str(), value);
    std::fputs(", \"comm_path\": {", jsonl_);
    for (size_t i = 0; i < opt_.comm_paths.size(); ++i)
      std::fprintf(jsonl_, "%s\"%s\": \"%s\"", i ? ", " : "", opt_.comm_paths[i].first.c_str(),
                   opt_.comm_paths[i].second.c_str());
    std::fputs("}", jsonl_);
    std::fputs("}\n", jsonl_);
    std::fflush(jsonl_);
  }
}

}  // namespace dtrain::engine::trainer
