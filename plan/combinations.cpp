// The combination rules (combinations.h), one function per feature that
// imposes them. The builtin engine runs DDP or ZeRO-1/2/3 with TP, SP, PP
// and EP in fp32 or bf16 (autocast) on CPU or CUDA; what it cannot run
// together is a clear error rather than a silently different run.
#include "plan/combinations.h"

#include <cstdint>

#include "common/error.h"
#include "plan/model_size.h"

namespace dtrain::plan {
namespace {

using Problems = std::vector<std::string>;

// Pipeline parallelism: ZeRO-3 would gather each stage's units per micro-batch.
void pipeline_rules(const JobSpec& spec, Problems& out) {
  if (spec.parallel.pp > 1 && spec.parallel.zero == 3)
    out.push_back("parallel.zero = 3 with parallel.pp = " + std::to_string(spec.parallel.pp) +
                  " is not implemented yet; use zero 0, 1 or 2 with pp");
}

// Mixture of experts. Under TP each rank of the tp group dispatches 1/tp of
// a micro-batch's tokens (they are the same on every TP rank; with sequence
// parallelism the layer gathers them first). Any pipeline stage may hold
// MoE blocks.
void moe_rules(const JobSpec& spec, Problems& out) {
  const int tp = spec.parallel.tp;
  if (spec.model.moe.experts <= 0) return;
  const int64_t tokens = int64_t(spec.train.micro_batch) * spec.model.seq_len;
  if (tp > 1 && tokens % tp != 0)
    out.push_back("train.micro_batch * model.seq_len = " + std::to_string(tokens) +
                  " tokens do not split over parallel.tp = " + std::to_string(tp) +
                  " (each TP rank dispatches its share to the experts); use a micro_batch or seq_len "
                  "making them a multiple of tp");
}

// Context parallelism: ring attention over the tiled kernel, dense blocks,
// and the sequence split by cp alone.
void context_rules(const JobSpec& spec, Problems& out) {
  const int cp = spec.parallel.cp;
  if (cp <= 1) return;
  const std::string at = "parallel.cp = " + std::to_string(cp);
  if (spec.model.moe.experts > 0)
    out.push_back(at + " with model.moe.experts = " + std::to_string(spec.model.moe.experts) +
                  ": mixture of experts does not run under context parallelism yet; use parallel.cp 1 or a "
                  "dense model (model.moe.experts 0)");
  if (spec.parallel.sequence_parallel)
    out.push_back(at + " with parallel.sequence_parallel = true: the two do not compose yet; set "
                       "parallel.sequence_parallel false (cp already splits the activations by sequence)");
  if (spec.model.attention != AttentionImpl::tiled)
    out.push_back("model.attention = " + to_string(spec.model.attention) + " with " + at +
                  ": context parallelism runs ring attention over the tiled kernel; set model.attention: tiled");
}

void precision_rules(const JobSpec& spec, Problems& out) {
  if (spec.train.precision != Precision::fp32 && spec.train.precision != Precision::bf16)
    out.push_back("train.precision = " + to_string(spec.train.precision) +
                  " is not implemented yet; use precision fp32 or bf16");
}

void model_rules(const JobSpec& spec, Problems& out) {
  if (spec.model.kind != "gpt" && spec.model.kind != "llama")
    out.push_back("model.kind = " + spec.model.kind + " is unknown; use kind gpt or llama");
}

// In the order the engine reported them. A new parallelism adds one row
// with its own rules.
constexpr void (*kRules[])(const JobSpec&, Problems&) = {pipeline_rules, moe_rules, context_rules, precision_rules,
                                                         model_rules};

}  // namespace

std::vector<std::string> combination_problems(const JobSpec& spec) {
  Problems out;
  for (auto rule : kRules) rule(spec, out);
  return out;
}

void check_combinations(const JobSpec& spec) {
  check_model_size(spec);
  if (!spec.builtin_entrypoint()) return;  // a custom entrypoint runs what it can
  const Problems problems = combination_problems(spec);
  if (problems.empty()) return;
  std::string msg = spec.source + ": this spec asks for what the builtin engine cannot run:";
  for (const auto& p : problems) msg += "\n  " + p;
  throw Error(ErrorCode::config, msg, "change the fields above, or run your own entrypoint");
}

}  // namespace dtrain::plan
