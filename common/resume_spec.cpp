// resume_spec (resume_spec.h): which stored fields a resume may use, and the
// refusal that lists the others with their values.
#include "common/resume_spec.h"

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dtrain {
namespace {

constexpr size_t kMaxStoredSpecBytes = 4u << 20;  // a spec file's limit too

// The field's value as the user would write it (JSON strings are YAML), cut short.
std::string shown(const std::string& s) {
  std::string q = nlohmann::json(s.size() > 300 ? s.substr(0, 300) + "..." : s)
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return q;
}

std::string value_of(const JobSpec& s, const std::string& field) {
  if (field == "entrypoint") {
    std::string out = "[";
    for (size_t i = 0; i < s.entrypoint.size(); ++i) out += (i ? ", " : "") + shown(s.entrypoint[i]);
    return out + "]";
  }
  if (field == "log.dir") return shown(s.log.dir);
  if (field == "data.path") return shown(s.data.path);
  if (field == "data.blend" || field == "data.valid.blend") {  // files (prefixes), like data.path
    const std::vector<DataSource>& b = field == "data.blend" ? s.data.blend : s.data.valid.blend;
    std::string out = "[";
    for (size_t i = 0; i < b.size(); ++i) out += (i ? ", " : "") + shown(b[i].path);
    return out + "]";
  }
  if (field == "data.valid.path") return shown(s.data.valid.path);
  if (field == "cluster.rendezvous.token_file") return shown(s.cluster.rendezvous.token_file);
  return shown(s.cluster.rendezvous.endpoint);  // cluster.rendezvous.endpoint
}

// An override "key=value" gives `field` when key is the field or a section above it.
bool given(const std::vector<std::string>& overrides, const std::string& field) {
  for (const auto& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    if (key == field || field.compare(0, key.size() + 1, key + ".") == 0) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> resume_trusted_fields(const JobSpec& spec, bool rdzv_given) {
  std::vector<std::string> f = {"entrypoint", "log.dir"};
  if (spec.data.format != DataFormat::synthetic) f.push_back("data.path");
  if (!spec.data.blend.empty()) f.push_back("data.blend");
  f.push_back("data.valid.path");  // a file like data.path
  if (!spec.data.valid.blend.empty()) f.push_back("data.valid.blend");
  f.push_back("cluster.rendezvous.token_file");
  if (spec.cluster.nodes_max > 1 && !rdzv_given) f.push_back("cluster.rendezvous.endpoint");
  return f;
}

JobSpec resume_spec(const ResumeSpecInput& in, std::vector<std::string>* warnings) {
  const std::string root_override = "checkpoint.dir=" + in.checkpoint_root;
  if (!in.spec_file.empty()) {
    JobSpec spec = load_job_spec(in.spec_file, in.overrides, warnings);
    if (!spec.checkpoint.dir.empty()) return spec;
    std::vector<std::string> o = {root_override};
    o.insert(o.end(), in.overrides.begin(), in.overrides.end());
    return load_job_spec(in.spec_file, o, warnings);
  }
  if (in.stored_yaml.size() > kMaxStoredSpecBytes)
    throw Error(ErrorCode::config,
                in.source + " is " + std::to_string(in.stored_yaml.size()) +
                    " bytes, more than a job spec's maximum of 4 MiB",
                "resume with the run's spec: dtrain resume --ckpt DIR --spec FILE");
  // Checkpoints go on next to the one resumed from; the user's --set comes
  // last and wins.
  std::vector<std::string> o = {root_override};
  o.insert(o.end(), in.overrides.begin(), in.overrides.end());
  JobSpec spec = parse_job_spec(in.stored_yaml, in.source, o, warnings);
  const JobSpec defaults;
  // A stored fault section (chaos testing: kill, hang, slow, ...) would fire
  // again, since a resume is a first launch: injected only when given again.
  bool fault_given = false;
  for (const auto& ov : in.overrides)
    fault_given = fault_given || ov.rfind("fault.", 0) == 0 || ov.rfind("fault=", 0) == 0;
  if (spec.fault.active() && !fault_given) {
    if (warnings)
      warnings->push_back(in.source + ": fault.kind = " + to_string(spec.fault.kind) +
                          " is not applied on resume; to inject it again, give --set fault.kind=" +
                          to_string(spec.fault.kind) + " (and its rank, step, ms)");
    spec.fault = defaults.fault;
  }
  std::vector<std::string> refused;
  for (const auto& field : resume_trusted_fields(spec, in.rdzv_given))
    if (!given(in.overrides, field) && value_of(spec, field) != value_of(defaults, field))
      refused.push_back(field);
  if (refused.empty()) return spec;
  std::string msg = in.source + " names a command, file or host that dtrain resume does not take from a "
                                "checkpoint (a checkpoint is data; nothing in it is run or followed):";
  std::string sets;
  for (const auto& f : refused) {
    msg += "\n  " + f + " = " + value_of(spec, f);
    sets += " --set " + f + "=<value>";
  }
  throw Error(ErrorCode::config, msg,
              "if you trust these values, give them again on the command line:" + sets +
                  " (a list as YAML: --set 'entrypoint=[python3, train.py]'), or resume with "
                  "the run's own spec: dtrain resume --ckpt DIR --spec FILE");
}

}  // namespace dtrain
