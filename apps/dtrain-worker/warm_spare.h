// The worker's side of a warm spare (launcher/warm_spares.h): a dtrain-worker
// started with DTRAIN_WARM_SPARE set has loaded its libraries and waits
// here for the environment of the rank it is to run.
#pragma once

#include <string>
#include <vector>

namespace dtrain::worker {

// clearenv, then each "K=V" of env (also a new round's, round_channel.h).
void replace_environment(const std::vector<std::string>& env);

// Without DTRAIN_WARM_SPARE: returns true at once. Else reads "K=V\0"...
// "\0" from stdin, replaces the whole environment with it, puts /dev/null
// on stdin (unless the new environment has DTRAIN_ROUND_CHANNEL: the pipe
// then carries the next rounds) and returns true; false when stdin ends
// first (the agent discarded the spare: exit quietly).
bool wait_for_rank_if_spare();

}  // namespace dtrain::worker
