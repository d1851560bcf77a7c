// Pipeline parallelism (docs/ARCHITECTURE.md, 'Pipeline parallelism'): the
// GPT's layers split into pp stages (the embedding on the first, blocks evenly
// between, the head and the loss on the last) and a Schedule that runs one
// step's micro-batches over them by executing this stage's list of actions
// (plan.h: forward, backward, send/receive of activations and their gradients),
// a list that the simulator has accepted before the first step. Activations
// travel over the pp group with point-to-point send/recv of shapes known ahead.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "common/spec_enums.h"
#include "engine/comm/comm.h"
#include "engine/parallel/parallelize.h"
#include "engine/parallel/schedule.h"

namespace dtrain::engine::parallel {

// What one pp rank holds: `chunks` (virtual stages, interleaved schedules);
// chunk c is global stage c * size + rank (Megatron's interleaving), and
// global stage s holds blocks [begin[s], begin[s+1]). Without virtual
// stages, chunks = 1.
struct PipelineStage {
  int rank = 0, size = 1;  // in the pp group
  int chunks = 1;
  std::vector<int> begin;  // size * chunks + 1 block boundaries, begin[0] = 0
  int global_stage(int chunk) const { return chunk * size + rank; }
  int first_block(int chunk) const { return begin[size_t(global_stage(chunk))]; }
  int last_block(int chunk) const { return begin[size_t(global_stage(chunk)) + 1]; }
  bool first(int chunk) const { return global_stage(chunk) == 0; }                 // holds the embedding
  bool last(int chunk) const { return global_stage(chunk) == size * chunks - 1; }  // holds the head and loss
  bool holds_block(int block) const;
};

// Rank `rank` of `size` with `chunks` virtual stages; stage_layers: the
// blocks of each global stage (size * chunks entries, each >= 1: JobSpec's
// stage_layers(), which the spec checks).
PipelineStage pipeline_stage(const std::vector<int>& stage_layers, int rank, int size, int chunks = 1);

// Whether `stage` keeps parameter `name`: wte and wpe on the first stage
// (a tied wte also on the last: tied_embedding.h), ln_f and the head on the
// last, each block on the stage that runs it.
bool stage_keeps(const std::string& name, const PipelineStage& stage, bool tie_embeddings);

// Keeps only this stage's parameters in parts.named_params (the others'
// storage is released): run before tensor and data parallelism, which then
// see this stage's parameters only.
void keep_stage_parameters(ModelParts& parts, const PipelineStage& stage);

// kind: gpipe | 1f1b | interleaved_1f1b; micro = train.grad_accum; activation: the shape of
// what one stage hands the next ([micro_batch, T (/ tp with sequence
// parallelism), d_model]). Builds and simulates the plan: a plan the
// simulator rejects is a dtrain::Error(config) here, before any step.
// fault_drop_grad (fault.kind no_pp_grad): every gradient sent back to the
// previous stage is zeros.
std::unique_ptr<Schedule> make_pipeline_schedule(PipelineSchedule kind, int micro, comm::Group& pp,
                                                 PipelineStage stage, std::vector<int64_t> activation,
                                                 bool fault_drop_grad = false);

}  // namespace dtrain::engine::parallel
