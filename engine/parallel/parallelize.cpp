// parallelize (parallelize.h): the one place that knows which parallelisms
// exist. The order is fixed and matters: a pipeline split decides which
// layers this rank holds, tensor parallelism then shards those layers,
// activation checkpointing wraps the (sharded) blocks, expert parallelism
// places the experts, and data parallelism (ZeRO / DDP) comes last, over the
// parameters that are left on this rank.
#include "engine/parallel/parallelize.h"

#include <algorithm>

#include "common/error.h"
#include "common/offload_files.h"
#include "engine/comm/no_sync_group.h"
#include "engine/parallel/activation_checkpoint.h"
#include "engine/parallel/context/context_parallel.h"
#include "engine/parallel/ddp/ddp_sync.h"
#include "engine/parallel/expert/expert_parallel.h"
#include "engine/parallel/pipeline/pipeline_schedule.h"
#include "engine/parallel/pipeline/tied_embedding.h"
#include "engine/parallel/schedule.h"
#include "engine/parallel/tensor/tensor_parallel.h"
#include "engine/parallel/zero/zero_sync.h"

namespace dtrain::engine::parallel {

Parallelized::Parallelized() = default;
Parallelized::~Parallelized() = default;
Parallelized::Parallelized(Parallelized&&) noexcept = default;
Parallelized& Parallelized::operator=(Parallelized&&) noexcept = default;

model::BuildScope build_scope(const JobSpec& spec, const mesh::Coord& coord) {
  const mesh::Mesh m = spec.mesh();
  model::BuildScope scope;
  const int pp = spec.parallel.pp, tp = spec.parallel.tp;
  if (pp > 1) {
    const PipelineStage stage = pipeline_stage(spec.stage_layers(), mesh::index_in_group(m, mesh::GroupKind::pp, coord),
                                               pp, spec.parallel.pipeline_virtual_stages);
    scope.keeps = [stage, tie = spec.model.tie_embeddings](const std::string& name) {
      return stage_keeps(name, stage, tie);
    };
  }
  if (tp > 1)
    scope.slice = tp_slicer(spec.model.effective_kv_heads(), mesh::index_in_group(m, mesh::GroupKind::tp, coord), tp,
                            spec.model.tp_vocab == TpVocab::parallel);
  if (spec.model.moe.experts > 0 && spec.parallel.ep > 1 && spec.model.moe.experts % spec.parallel.ep == 0) {
    scope.ep_rank = coord.ep;  // the index in its ep group (index_in_group has no axis for ep)
    scope.ep_size = spec.parallel.ep;
  }
  return scope;
}

Parallelized parallelize(const JobSpec& spec, comm::Comm& comm, model::Gpt model,
                         const ParallelizeOptions& options) {
  Parallelized out;
  // The layout faults of the spec's fault section: first launch only.
  const auto fault = [&](FaultKind kind) { return spec.fault.kind == kind && comm.info().restart == 0; };
  out.parts.model = std::move(model);
  for (auto& item : out.parts.model->named_parameters(/*recurse=*/true))
    out.parts.named_params.emplace_back(item.key(), item.value());

  // 1. Pipeline split over the pp group: this rank keeps its stage's layers
  //    (pp = 1: the whole model, run by the plain micro-step loop).
  comm::Group& pp = comm.group(mesh::GroupKind::pp);
  int tied_peer = -1;  // a tied head under pp: the pp index of the other wte copy's stage
  if (pp.size() > 1) {
    const PipelineStage stage =
        pipeline_stage(spec.stage_layers(), pp.rank(), pp.size(), spec.parallel.pipeline_virtual_stages);
    keep_stage_parameters(out.parts, stage);
    if (spec.model.tie_embeddings && stage.first(0)) tied_peer = pp.size() - 1;
    if (spec.model.tie_embeddings && stage.last(stage.chunks - 1)) tied_peer = 0;
    const int tp_size = comm.group(mesh::GroupKind::tp).size();
    const int64_t t = (spec.parallel.sequence_parallel ? spec.model.seq_len / tp_size : spec.model.seq_len) /
                      spec.parallel.cp;  // the tokens this rank holds
    out.schedule = make_pipeline_schedule(spec.parallel.pipeline_schedule, spec.train.grad_accum, pp, stage,
                                          {spec.train.micro_batch, t, spec.model.d_model}, fault(FaultKind::no_pp_grad));
  } else {
    out.schedule = make_no_pipeline();
  }
  // 2. Tensor parallelism over the tp group: split layers keep their slices.
  comm::Group& tp = comm.group(mesh::GroupKind::tp);
  if (tp.size() > 1) {
    out.parts.layouts = apply_tensor_parallel(*out.parts.model, out.parts.named_params, tp,
                                              spec.parallel.sequence_parallel, spec.model.tp_vocab == TpVocab::parallel,
                                              fault(FaultKind::no_tp_reduce));
  } else {
    for (auto& [name, p] : out.parts.named_params) {
      ParamLayout l;
      l.global_shape = out.parts.model->whole_shape(name, p);  // experts built cut: [E, ...]
      out.parts.layouts.push_back(std::move(l));
    }
  }
  // The last stage's copy of a tied wte: neither counted in the norm nor
  // written (the first stage's is).
  if (tied_peer == 0)
    for (size_t i = 0; i < out.parts.named_params.size(); ++i)
      if (out.parts.named_params[i].first == "wte.weight") out.parts.layouts[i].tp_owner = false;
  // 2b. Context parallelism over the cp group: this rank's two chunks of
  //     every sequence, attention as a ring over the group.
  comm::Group& cp = comm.group(mesh::GroupKind::cp);
  if (cp.size() > 1) {
    context::apply_context_parallel(*out.parts.model, cp, spec.model.seq_len, fault(FaultKind::cp_local_attention));
    out.local_batch = [n = cp.size(), r = cp.rank()](at::Tensor& inputs, at::Tensor& targets) {
      context::take_local_tokens(inputs, targets, n, r);
    };
  }
  // 3. Activation checkpointing of the (sharded) blocks this rank holds.
  apply_activation_checkpointing(*out.parts.model, spec.train.recompute,
                                 fault(FaultKind::recompute_redraw));
  // 4. Expert parallelism over the ep group: each rank keeps E / ep experts
  //    of every MoE layer; their gradients go over edp (below), the rest
  //    over dp.
  const bool moe = spec.model.moe.experts > 0;
  if (moe)
    apply_expert_parallel(*out.parts.model, out.parts.named_params, out.parts.layouts, comm.group(mesh::GroupKind::ep));
  DenseAndExperts split = moe ? split_experts(out.parts.named_params, out.parts.layouts)
                              : DenseAndExperts{out.parts.named_params, out.parts.layouts, {}};
  auto& named = split.dense;
  auto& layouts = split.dense_layouts;
  // 5. Data parallelism over every replica of this rank's shard, dp x cp
  //    (the dp group when cp = 1): ZeRO (sharded) or DDP (replicated).
  //    fault.kind no_grad_sync: the gradient-reduction groups (dp_cp, and
  //    edp under MoE) are comm::NoSyncGroups, whose reductions leave every
  //    rank its own gradient while their gathers and broadcasts still run.
  const auto grad_group = [&](mesh::GroupKind kind) -> comm::Group& {
    if (!fault(FaultKind::no_grad_sync)) return comm.group(kind);
    out.groups.push_back(std::make_unique<comm::NoSyncGroup>(comm.group(kind)));
    return *out.groups.back();
  };
  comm::Group& replicas = grad_group(mesh::gradient_group(comm.info().mesh.cp()));
  if (spec.parallel.zero > 0) {
    ZeroOptions z;
    z.stage = spec.parallel.zero;
    z.reshard_after_forward = spec.parallel.fsdp_reshard_after_forward;
    z.prefetch = spec.parallel.fsdp_prefetch;
    z.shared_params = spec.parallel.fsdp_shared_params;
    // train.offload.params: the shards in a file per rank (nvme) or a host
    // buffer (host) between uses.
    const OffloadSpec& off = spec.train.offload;
    if (off.params != OffloadTarget::none) {
      if (off.params == OffloadTarget::nvme)
        z.offload_file = offload_params_file(off.path, spec.job.name, comm.info().rank);
      z.offload_host = off.params == OffloadTarget::host;
      z.offload_prefetch = off.prefetch;
      z.offload_drop_writes = spec.fault.kind == FaultKind::offload_no_writeback;
    }
    // The units this rank holds, numbered densely (a pipeline stage holds
    // some of the model's units only).
    std::vector<int> unit_of;
    for (auto& [name, p] : named) unit_of.push_back(out.parts.model->unit_of(name));
    std::vector<int> dense = unit_of;
    std::sort(dense.begin(), dense.end());
    dense.erase(std::unique(dense.begin(), dense.end()), dense.end());
    for (int& u : unit_of) u = int(std::lower_bound(dense.begin(), dense.end(), u) - dense.begin());
    out.grad_sync = make_zero_sync(named, layouts, std::move(unit_of),
                                   *out.parts.model, replicas, tp, pp, z);
  } else {
    DdpOptions dopt;
    dopt.bucket_mb = spec.parallel.ddp_bucket_mb;
    dopt.overlap = spec.parallel.ddp_overlap;
    dopt.reduce_bf16 = spec.parallel.reduce_dtype == ReduceDtype::bf16;
    dopt.sync_initial_params = options.sync_initial_params;
    out.grad_sync = make_ddp_sync(named, layouts, replicas, tp, pp, dopt);
  }
  if (moe)  // the experts' gradients over edp, wrapped around the dense sync; counters over the real dp
    out.grad_sync = make_moe_sync(std::move(out.grad_sync), std::move(split.experts), *out.parts.model,
                                  comm.group(mesh::GroupKind::dp), tp, pp, comm.group(mesh::GroupKind::ep),
                                  grad_group(mesh::GroupKind::edp),
                                  {spec.model.moe.balance == MoeBalance::bias, spec.model.moe.bias_rate});
  if (tied_peer >= 0)
    out.grad_sync = make_tied_embedding_sync(std::move(out.grad_sync), pp, tied_peer, fault(FaultKind::no_grad_sync));
  return out;
}

}  // namespace dtrain::engine::parallel
