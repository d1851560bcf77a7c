// MemoryCheck (memory_check.h).
#include "engine/trainer/memory_check.h"

#include <algorithm>
#include <cmath>

#include "common/log.h"
#include "plan/memory_plan.h"

namespace dtrain::engine::trainer {

MemoryCheck::MemoryCheck(const JobSpec& spec, int rank, bool cpu)
    : spec_(spec), rank_(rank), enabled_(cpu), check_step_(spec.train.steps >= 2 ? 2 : 1) {}

void MemoryCheck::compare(const MemoryStats& m, bool log_rank) const {
  plan::RankMemory p;
  try {
    p = plan::plan_rank(spec_, rank_);
  } catch (const std::exception& e) {
    DTRAIN_WARN("memory plan: not available for this spec ({})", e.what());
    return;
  }
  const double measured_static = double(m.params + m.grads + m.optimizer);
  const double static_off = std::fabs(double(p.static_bytes()) / std::max(measured_static, 1.0) - 1.0);
  // Under bf16 / fp16 autocast the plan's activations are fp32's, an upper
  // bound (autocast keeps some in 2 bytes): only a measured peak above it
  // is off then.
  const bool upper_bound = spec_.train.precision != Precision::fp32;
  const double peak_ratio = double(p.peak_bytes) / std::max(double(m.peak), 1.0) - 1.0;
  const double peak_off = upper_bound ? std::max(0.0, -peak_ratio) : std::fabs(peak_ratio);
  const std::string line = fmt::format(
      "memory plan vs measured after step {} (rank {}): static {} predicted / {} measured ({:+.1f}%), "
      "peak {} predicted{} / {} measured ({:+.1f}%)",
      check_step_, rank_, int64_t(p.static_bytes()), int64_t(measured_static),
      100.0 * (double(p.static_bytes()) / std::max(measured_static, 1.0) - 1.0), p.peak_bytes,
      upper_bound ? " (an upper bound under autocast)" : "", m.peak, 100.0 * peak_ratio);
  if (static_off > kWarnFraction || peak_off > kWarnFraction)
    DTRAIN_WARN("{}: more than {:.0f}% off; `dtrain plan` is wrong for this layout", line, 100 * kWarnFraction);
  else if (log_rank)
    DTRAIN_INFO("{}", line);
}

}  // namespace dtrain::engine::trainer
