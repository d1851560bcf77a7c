// DdpSync: Ddp behind the GradSync interface, and the checkpoint view of a
// replicated model (every dp rank holds everything; the dp ranks split the
// writing, about 1/dp each).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/parallel/ddp/ddp.h"
#include "engine/parallel/grad_sync.h"
#include "engine/parallel/param_layout.h"

namespace dtrain::engine::parallel {

// layouts: where each parameter sits in the global model (tensor
// parallelism); dp: the group the gradient buckets are all-reduced over;
// tp and pp: the groups over which the model is split, so the squared norms
// of their parameters add up over them.
std::unique_ptr<GradSync> make_ddp_sync(std::vector<std::pair<std::string, at::Tensor>> named_params,
                                        std::vector<ParamLayout> layouts, comm::Group& dp,
                                        comm::Group& tp, comm::Group& pp, DdpOptions options);

}  // namespace dtrain::engine::parallel
