// The job spec `dtrain resume` runs. A checkpoint is data: its stored spec
// gives the model, mesh, training and checkpoint settings, but never a
// command to run or a place to read or write. Those fields are taken from it
// only when they hold what dtrain uses anyway (the default), and otherwise
// only when the user gives them again (--set, or --spec FILE).
#pragma once

#include <string>
#include <vector>

#include "common/job_spec.h"

namespace dtrain {

struct ResumeSpecInput {
  std::string stored_yaml;             // the checkpoint's spec (index.json "spec")
  std::string source;                  // "<dir>/index.json (spec)", for messages
  std::string spec_file;               // --spec FILE: the spec itself, the stored one unused ("" = none)
  std::vector<std::string> overrides;  // --set key=value, in order
  std::string checkpoint_root;         // checkpoint.dir unless the user gives one
  bool rdzv_given = false;             // --rdzv: the stored endpoint is not used
};

// Fields of a stored spec that name a command, a file or a host the token
// goes to: "entrypoint", "log.dir", "data.path" (unless data.format is
// synthetic), "data.valid.path", "data.valid.blend" (when given),
// "cluster.rendezvous.token_file", and for a multi-node job without --rdzv
// "cluster.rendezvous.endpoint".
std::vector<std::string> resume_trusted_fields(const JobSpec& spec, bool rdzv_given);

// The spec to resume with. Without spec_file: the stored spec with
// checkpoint.dir = checkpoint_root and then the overrides; a trusted field
// that differs from the default and was not given in an override throws
// dtrain::Error(config) listing each such field with its stored value and
// how to give it again. With spec_file: that file and the overrides
// (checkpoint.dir = checkpoint_root when the file sets none).
JobSpec resume_spec(const ResumeSpecInput& in, std::vector<std::string>* warnings);

}  // namespace dtrain
