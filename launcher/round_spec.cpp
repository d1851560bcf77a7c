// write_round_spec (see round_spec.h): the round's spec from spec_for_round,
// written and announced; deciding the round's mesh is the rendezvous' job.
#include "launcher/round_spec.h"

#include "common/log.h"
#include "common/safe_output.h"
#include "common/spec_resolve.h"

namespace dtrain::launcher {

int write_round_spec(const JobSpec& spec, const rendezvous::Assignment& a, const std::string& path,
                     int previous_gbs) {
  const JobSpec round = spec_for_round(spec, a.num_nodes, a.mesh.dp());
  write_file_safely(path, job_spec_to_yaml(round), "log.dir's spec.resolved.yaml", Clobber::replace);
  const std::string autos = auto_sizes_text(spec, round);
  DTRAIN_INFO("round {}: {} node(s), world {}: {}global batch {} = micro_batch {} x grad_accum {} x dp {}",
              a.round, a.num_nodes, a.world, autos.empty() ? "" : autos + "; ", round.global_batch(),
              round.train.micro_batch, round.train.grad_accum, round.parallel.dp);
  if (previous_gbs > 0 && previous_gbs != round.global_batch())
    DTRAIN_WARN("round {}: the global batch changes from {} to {} sequences (dp {}); the loss curve "
                "changes with it; set train.global_batch and train.grad_accum: auto to keep it",
                a.round, previous_gbs, round.global_batch(), round.parallel.dp);
  return round.global_batch();
}

}  // namespace dtrain::launcher
