// model_size and check_fits_memory (model_size.h). The parameter count
// follows engine/model/gpt.cpp: untied embedding and head, wpe of seq_len
// rows, per block 12 d^2 + 13 d (qkv, proj, fc, proj with biases, two norms);
// a MoE block (engine/model/moe.h) trades the MLP (8 d^2 + 5 d) for a router
// (d E) and E experts of 2 d F + F + d, of which a rank holds E / ep.
#include "common/model_size.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "common/error.h"

namespace dtrain {

ModelSize model_size(const JobSpec& spec) {
  const ModelSpec& m = spec.model;
  const double d = m.d_model, v = m.vocab, t = m.seq_len, l = m.layers;
  ModelSize s;
  const MoeSpec& moe = m.moe;
  const double experts = std::max(0, moe.experts), f = moe.d_ff > 0 ? moe.d_ff : 4 * d;
  const double moe_blocks = experts > 0 ? std::ceil(l / std::max(1, moe.every)) : 0;
  const double expert_params = moe_blocks * experts * (2 * d * f + f + d);
  const double dense = 2 * v * d + t * d + l * (12 * d * d + 13 * d) + 2 * d +
                       moe_blocks * (d * experts - (8 * d * d + 5 * d));
  s.params = dense + expert_params;
  s.state_bytes = s.params * kStateBytesPerParam;
  const ParallelSpec& p = spec.parallel;
  const double split = double(std::max(1, p.tp)) * double(std::max(1, p.pp));
  const double dp = std::max(1, p.dp);
  // Per parameter: 4 B weights, 4 B grads, 8 B AdamW; ZeRO-1 shards the
  // optimizer over dp, ZeRO-2 also the grads, ZeRO-3 also the weights.
  // Experts: E / ep per rank, never ZeRO-sharded.
  const double weights = 4 / (p.zero >= 3 ? dp : 1), grads = 4 / (p.zero >= 2 ? dp : 1),
               optim = 8 / (p.zero >= 1 ? dp : 1);
  s.rank_bytes = dense / split * (weights + grads + optim) +
                 expert_params / std::max(1, p.ep) * kStateBytesPerParam;
  s.node_bytes = s.rank_bytes * std::max(1, spec.cluster.procs_per_node);
  return s;
}

uint64_t machine_memory_bytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  std::ifstream cg("/sys/fs/cgroup/memory.max");
  unsigned long long limit = 0;
  if (cg >> limit && limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;  // "max" reads as 0
  return bytes;
}

std::string gigabytes(double bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  return buf;
}

void check_fits_memory(const JobSpec& spec, bool allow_large) {
  if (allow_large || spec.cluster.device != "cpu") return;
  const ModelSize s = model_size(spec);
  const uint64_t have = machine_memory_bytes();
  if (have == 0 || s.node_bytes <= double(have)) return;
  char params[32];
  std::snprintf(params, sizeof params, "%.3g", s.params);
  throw Error(ErrorCode::config,
              spec.source + ": model.d_model = " + std::to_string(spec.model.d_model) +
                  ", model.layers = " + std::to_string(spec.model.layers) + ", model.vocab = " +
                  std::to_string(spec.model.vocab) + ": " + params +
                  " parameters need " + gigabytes(s.node_bytes) +
                  " of fp32 training state on this machine (" +
                  std::to_string(spec.cluster.procs_per_node) + " rank(s) x " +
                  gigabytes(s.rank_bytes) + "), more than its " + gigabytes(double(have)),
              "make the model smaller, shard it (parallel.tp, parallel.pp, parallel.zero), or "
              "pass --allow-large to try anyway");
}

}  // namespace dtrain
