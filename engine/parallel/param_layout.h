// Where a parameter's local tensor sits in the global (1-process) one, for
// checkpoints and for norms that must count every element once. Tensor
// parallelism keeps, along one dim, a few segments of the global tensor
// (column-parallel qkv: this rank's heads of q, of k and of v); everything
// else is whole. Pure bookkeeping: no communication.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/parallel/grad_sync.h"

namespace dtrain::engine::parallel {

struct ParamLayout {
  struct Segment {
    int64_t local_begin = 0, local_end = 0;  // along `dim` of the local tensor
    int64_t global_begin = 0;                // where local_begin sits in the global tensor
  };
  std::vector<int64_t> global_shape;
  int dim = -1;                   // -1: the local tensor is the whole global one
  std::vector<Segment> segments;  // along `dim`, in local order, covering it
  // Whether this rank is the one (of its TP group) that counts and writes
  // this parameter: every rank for a TP-sharded one, TP rank 0 for a
  // replicated one.
  bool tp_owner = true;
  // Sequence parallelism: each TP rank's gradient of this (replicated)
  // parameter covers its own positions only; the GradSync sums it over tp.
  bool sum_grad_over_tp = false;

  static ParamLayout whole(const at::Tensor& t);
  bool sharded() const { return dim >= 0; }
};

// The checkpoint entries of a block of a local tensor: `local` is the block
// ({begin, end} per dim, in local coordinates) and `tensor` its values
// (shaped like the block); split where the block crosses segments, each
// part named `name` with global shape and slice, and keyed
// "<key_prefix>#<global element offset of its first element>" when
// key_prefix is not empty.
// Sums `grads` (the gradients of sum_grad_over_tp parameters, or pieces of
// them, in the same order on every TP rank) over tp in one all-reduce.
void sum_over_tp(const std::vector<at::Tensor>& grads, comm::Group& tp);

std::vector<StateEntry> global_entries(const std::string& name, const ParamLayout& layout,
                                       const std::vector<std::pair<int64_t, int64_t>>& local,
                                       const at::Tensor& tensor, bool keyed);

}  // namespace dtrain::engine::parallel
