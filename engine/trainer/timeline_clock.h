// start_timeline: turns the timeline recorder (common/timeline.h) on for
// log.trace.steps and measures this rank's clock offset to rank 0 by
// ping-pong over the control group. Called by every rank at set-up (the
// measurement is collective); does nothing without log.trace.steps.
#pragma once

#include "engine/trainer/train_session.h"

namespace dtrain::engine::trainer {

void start_timeline(TrainSession& s);

}  // namespace dtrain::engine::trainer
