// Stragglers: each rank's compute time of a step (its step time minus the
// time it sat blocked in collectives, since a synchronous all-reduce makes
// every rank's step time equal) gathered over the world at log steps; the
// slowest rank and its ratio to the median. Measures; decides nothing.
#pragma once

#include "engine/comm/comm.h"

namespace dtrain::engine::trainer {

struct StragglerStats {
  int slowest_rank = -1;
  double ratio = 0;  // slowest compute / median compute
  double slowest_s = 0, median_s = 0;
};

constexpr double kStragglerWarnRatio = 1.2;  // the console warns above this

// Collective over `world` (every rank calls it on the same steps).
StragglerStats straggler_stats(comm::Group& world, double compute_s);

}  // namespace dtrain::engine::trainer
