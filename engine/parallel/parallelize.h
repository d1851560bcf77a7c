// parallelize (docs/ARCHITECTURE.md, 'The parallelize seam'; TorchTitan's
// shape): applies the parallelisms of the spec to a model in one fixed order and
// hands the trainer what it needs without naming any of them: the model parts
// this rank holds, a GradSync, and a Schedule. Adding a parallelism = one folder
// here, one line in parallelize(), one parity test; the trainer does not change.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "common/mesh.h"
#include "engine/comm/comm.h"
#include "engine/model/gpt.h"
#include "engine/parallel/grad_sync.h"
#include "engine/parallel/param_layout.h"

namespace dtrain::engine::parallel {

// The stage(s) of the model this rank holds (today: the whole GPT), with its
// parameters by stable name in registration order.
struct ModelParts {
  model::Gpt model{nullptr};
  std::vector<std::pair<std::string, at::Tensor>> named_params;
  std::vector<ParamLayout> layouts;  // per named_params entry: where it sits in the global model
};

class Schedule;

struct Parallelized {
  ModelParts parts;
  // Groups beyond the Comm's that grad_sync uses (fault.kind no_grad_sync's
  // comm::NoSyncGroup): declared before it, so they outlive it.
  std::vector<std::unique_ptr<comm::Group>> groups;
  std::unique_ptr<GradSync> grad_sync;
  std::unique_ptr<Schedule> schedule;
  // This rank's part of each micro-batch's inputs and targets [B, T] (its
  // sequence chunks under context parallelism); empty: all of it.
  std::function<void(at::Tensor& inputs, at::Tensor& targets)> local_batch;
  Parallelized();
  ~Parallelized();
  Parallelized(Parallelized&&) noexcept;
  Parallelized& operator=(Parallelized&&) noexcept;
};

// What the rank at `coord` of the spec's mesh builds of the model (gpt.h's
// BuildScope): its pipeline stage's parameters (with a tied wte's copy on
// the last stage), its tensor-parallel slices, its E / ep experts of every
// MoE block; exactly what parallelize() keeps.
model::BuildScope build_scope(const JobSpec& spec, const mesh::Coord& coord);

// `model` is the full model, initialised identically on every rank, or
// built by build_scope() for this rank; already on this rank's device.
// Collective over the groups it uses.
struct ParallelizeOptions {
  // false: the replicas' weights are not made equal (DDP's broadcast from dp
  // rank 0 is skipped) because the caller loads every one of them next.
  bool sync_initial_params = true;
};
Parallelized parallelize(const JobSpec& spec, comm::Comm& comm, model::Gpt model,
                         const ParallelizeOptions& options = {});

}  // namespace dtrain::engine::parallel
