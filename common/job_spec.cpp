// The job spec's entry points: load a file or text, apply --set overrides,
// convert, validate, and turn the collected problems into one dtrain::Error.
// The steps themselves live in spec_parse / spec_convert / spec_validate.
#include "common/job_spec.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include "common/error.h"
#include "common/spec_detail.h"

namespace dtrain {
namespace {

// Problems in file order: positioned ones by line and column, then the ones
// about the whole file, then those of --set overrides in the order given.
std::vector<std::string> in_file_order(const std::string& source,
                                       std::vector<std::string> errors) {
  std::string prefix = (source.empty() ? "<spec>" : source) + ":";
  auto key = [&](const std::string& e) {
    long line = 0, col = 0;
    if (e.compare(0, prefix.size(), prefix) == 0 &&
        std::sscanf(e.c_str() + prefix.size(), "%ld:%ld:", &line, &col) == 2)
      return std::tuple<int, long, long>{0, line, col};
    return std::tuple<int, long, long>{e.compare(0, 6, "--set ") == 0 ? 2 : 1, 0, 0};
  };
  std::stable_sort(errors.begin(), errors.end(),
                   [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
  return errors;
}

[[noreturn]] void throw_problems(const std::string& source,
                                 const std::vector<std::string>& errors) {
  std::string name = source.empty() ? "the job spec" : source;
  std::string msg;
  if (errors.size() == 1) {
    msg = errors.front();
  } else {
    msg = std::to_string(errors.size()) + " problems in " + name + ":";
    for (const auto& e : errors) msg += "\n  " + e;
  }
  throw Error(ErrorCode::config, msg,
              "fix the fields above; `dtrain validate SPEC` checks a spec without running it");
}

void finish(detail::Problems& problems, const std::string& source,
            std::vector<std::string>* warnings) {
  if (!problems.errors.empty()) throw_problems(source, in_file_order(source, problems.errors));
  if (warnings)
    warnings->insert(warnings->end(), problems.warnings.begin(), problems.warnings.end());
}

// A spec must be a regular, non-empty file of sensible size: a directory,
// a FIFO or a device would otherwise read as an empty spec (all defaults)
// or never end.
void check_spec_file(const std::string& path) {
  constexpr uintmax_t kMaxSpecBytes = 4u << 20;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(ErrorCode::config, "SPEC = " + path + ": " + std::strerror(errno),
                "pass the path of a YAML spec, e.g. configs/quickstart.yaml");
  const char* kind = S_ISDIR(st.st_mode)   ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) ? "a device"
                     : S_ISREG(st.st_mode)  ? nullptr
                                            : "not a regular file";
  if (kind)
    throw Error(ErrorCode::config, "SPEC = " + path + " is " + kind + ", not a YAML file",
                "pass the path of a YAML spec, e.g. configs/quickstart.yaml");
  if (st.st_size == 0)
    throw Error(ErrorCode::config, "SPEC = " + path + " is empty (0 bytes)",
                "write the job spec into it; configs/quickstart.yaml is a complete example");
  if (uintmax_t(st.st_size) > kMaxSpecBytes)
    throw Error(ErrorCode::config,
                "SPEC = " + path + " is " + std::to_string(st.st_size) +
                    " bytes, more than a job spec's maximum of 4 MiB",
                "pass the YAML job spec, not a data file");
}

}  // namespace

JobSpec parse_job_spec(const std::string& yaml_text, const std::string& source,
                       const std::vector<std::string>& overrides,
                       std::vector<std::string>* warnings) {
  detail::SpecOrigin origin;
  origin.source = source;
  origin.root = detail::parse_yaml_text(yaml_text, source);  // malformed YAML throws here
  detail::Problems problems;
  detail::apply_overrides(overrides, origin, problems);
  detail::check_keys(origin, problems);
  JobSpec spec;
  spec.source = source;
  if (!origin.root.IsDefined() || origin.root.IsNull() || origin.root.IsMap())
    detail::convert_fields(origin, spec, problems);
  detail::resolve_auto_fields(origin, spec, problems);
  detail::validate_spec(spec, origin, problems);
  finish(problems, source, warnings);
  return spec;
}

JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides,
                      std::vector<std::string>* warnings) {
  check_spec_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(ErrorCode::config, path + ": cannot read the job spec (no such file, or not "
                                          "readable)",
                "pass the path of a YAML spec, e.g. configs/quickstart.yaml");
  std::ostringstream text;
  text << in.rdbuf();
  const YAML::Node root = detail::parse_yaml_text(text.str(), path);
  if (!root || root.IsNull())
    throw Error(ErrorCode::config,
                "SPEC = " + path + " holds no YAML (only blanks or comments): a job spec is a "
                                   "mapping of sections",
                "write at least one section, e.g. job: {name: my-run}; configs/quickstart.yaml "
                "is a complete example");
  return parse_job_spec(text.str(), path, overrides, warnings);
}

void validate_job_spec(const JobSpec& spec, std::vector<std::string>* warnings) {
  detail::SpecOrigin origin;
  origin.source = spec.source;
  origin.root = YAML::Node(YAML::NodeType::Null);
  detail::Problems problems;
  detail::validate_spec(spec, origin, problems);
  finish(problems, spec.source, warnings);
}

}  // namespace dtrain

namespace dtrain {

mesh::Mesh JobSpec::mesh() const {
  mesh::Order order = mesh::kDefaultOrder;
  std::string problem;
  mesh::parse_order(parallel.order, &order, &problem);  // validated: a bad order stays the default
  return mesh::make_mesh(parallel.dp, parallel.tp, parallel.pp, parallel.ep, parallel.cp, order);
}

std::vector<int> JobSpec::stage_layers() const {
  const int stages = std::max(1, parallel.pp) * std::max(1, parallel.pipeline_virtual_stages);
  if (!parallel.pipeline_layers_per_stage.empty()) return parallel.pipeline_layers_per_stage;
  return std::vector<int>(static_cast<size_t>(stages), model.layers / stages);
}

}  // namespace dtrain
