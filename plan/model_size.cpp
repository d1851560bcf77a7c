// model_size, model_size_problems and check_fits_memory (model_size.h),
// from param_count. A rank holds 1 / (tp * pp) of the dense parameters
// (an even share: memory_plan.h has the exact units) and E / ep experts.
#include "plan/model_size.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "common/machine_memory.h"
#include "plan/gpt_params.h"

namespace dtrain::plan {

ModelSize model_size(const JobSpec& spec) {
  const ParamCount count = param_count(spec.model);
  ModelSize s;
  s.params = count.total();
  s.state_bytes = s.params * kStateBytesPerParam;
  const ParallelSpec& p = spec.parallel;
  const double split = double(std::max(1, p.tp)) * double(std::max(1, p.pp));
  const double dp = std::max(1, p.dp);
  // Per parameter: 4 B weights, 4 B grads, 8 B AdamW; ZeRO-1 shards the
  // optimizer over dp, ZeRO-2 also the grads, ZeRO-3 also the weights.
  // Experts: E / ep per rank, never ZeRO-sharded.
  const double weights = 4 / (p.zero >= 3 ? dp : 1), grads = 4 / (p.zero >= 2 ? dp : 1),
               optim = 8 / (p.zero >= 1 ? dp : 1);
  s.rank_bytes = count.dense / split * (weights + grads + optim) +
                 count.experts / std::max(1, p.ep) * kStateBytesPerParam;
  s.node_bytes = s.rank_bytes * std::max(1, spec.cluster.procs_per_node);
  s.optim_rank_bytes = count.dense / split * optim + count.experts / std::max(1, p.ep) * 8;
  const OffloadTarget where = spec.train.offload.optimizer;
  // host: the moments and the update's fp32 master of the weights (4 B per
  // parameter the optimizer holds, half its moments' 8 B).
  s.host_rank_bytes = where == OffloadTarget::host ? 1.5 * s.optim_rank_bytes : 0;
  s.nvme_rank_bytes = where == OffloadTarget::nvme ? s.optim_rank_bytes : 0;
  const double shards = p.zero >= 3 ? count.dense / split * weights : 0;  // the weights' ZeRO-3 shards
  if (spec.train.offload.params == OffloadTarget::nvme) s.nvme_rank_bytes += shards;
  const double params_host = spec.train.offload.params == OffloadTarget::host ? shards : 0;
  s.host_rank_bytes += params_host;
  s.device_rank_bytes =
      s.rank_bytes - (where == OffloadTarget::host ? s.optim_rank_bytes : 0) - s.nvme_rank_bytes - params_host;
  return s;
}

std::vector<std::string> model_size_problems(const JobSpec& spec) {
  const ModelSpec& m = spec.model;
  if (m.vocab < 1 || m.layers < 1 || m.d_model < 1 || m.seq_len < 1) return {};  // the parser's errors
  const double params = param_count(m).total();
  if (params <= kMaxParams) return {};
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", params);
  const bool moe = m.moe.experts > 0;
  return {"model.d_model = " + std::to_string(m.d_model) + ", model.layers = " + std::to_string(m.layers) +
          ", model.vocab = " + std::to_string(m.vocab) +
          (moe ? ", model.moe.experts = " + std::to_string(m.moe.experts) : std::string()) + ": " + text +
          " parameters, more than the maximum 1e12 (16 TB of fp32 training state); use a smaller "
          "model.d_model or model.layers" + (moe ? " or fewer model.moe.experts" : "")};
}

void check_model_size(const JobSpec& spec) {
  const std::vector<std::string> problems = model_size_problems(spec);
  if (!problems.empty())
    throw Error(ErrorCode::config, spec.source + ": " + problems.front(), "shrink the model fields named above");
}

void check_fits_memory(const JobSpec& spec, bool allow_large) {
  if (allow_large) return;
  ModelSize s = model_size(spec);
  // Host memory: on a CPU the device's bytes are host bytes too; nvme files are neither.
  s.rank_bytes = s.host_rank_bytes + (spec.cluster.device == DeviceKind::cpu ? s.device_rank_bytes : 0);
  s.node_bytes = s.rank_bytes * std::max(1, spec.cluster.procs_per_node);
  const uint64_t have = machine_memory_bytes();
  if (have == 0 || s.node_bytes <= double(have)) return;
  char params[32];
  std::snprintf(params, sizeof params, "%.3g", s.params);
  throw Error(ErrorCode::config,
              spec.source + ": model.d_model = " + std::to_string(spec.model.d_model) +
                  ", model.layers = " + std::to_string(spec.model.layers) + ", model.vocab = " +
                  std::to_string(spec.model.vocab) + ": " + params +
                  " parameters need " + gigabytes(s.node_bytes) +
                  " of fp32 training state in this machine's memory (" +
                  std::to_string(spec.cluster.procs_per_node) + " rank(s) x " +
                  gigabytes(s.rank_bytes) + "), more than its " + gigabytes(double(have)),
              "make the model smaller, shard it (parallel.tp, parallel.pp, parallel.zero), move AdamW's "
              "state to files (train.offload.optimizer: nvme), or "
              "pass --allow-large to try anyway");
}

}  // namespace dtrain::plan
