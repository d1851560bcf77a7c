// The resolved spec of one rendezvous round (DTRAIN_SPEC): the job spec with
// the round's node count and dp, and train.grad_accum re-derived when auto,
// written for the workers before they start and announced in the log. The
// mesh itself is the rendezvous' decision; this only writes it down.
#pragma once

#include <string>

#include "common/job_spec.h"
#include "rendezvous/rendezvous_types.h"

namespace dtrain::launcher {

// Writes <path> (renamed into place: agents sharing log.dir write the same
// text) and logs the derived sizes. `previous_gbs` is the global batch of
// this agent's last round (0 = none): a change is warned about. Returns the
// round's global batch. Throws Error(config) when the round cannot keep it.
int write_round_spec(const JobSpec& spec, const rendezvous::Assignment& a, const std::string& path,
                     int previous_gbs);

}  // namespace dtrain::launcher
