// The job spec's entry points: load a file or text, apply --set overrides,
// convert, validate, and turn the collected problems into one dtrain::Error.
// The steps themselves live in spec_parse / spec_convert / spec_validate.
#include "common/job_spec.h"

#include <algorithm>
#include <cstdio>
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
  detail::validate_spec(spec, origin, problems);
  finish(problems, source, warnings);
  return spec;
}

JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides,
                      std::vector<std::string>* warnings) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(ErrorCode::config, path + ": cannot read the job spec (no such file, or not "
                                          "readable)",
                "pass the path of a YAML spec, e.g. configs/quickstart.yaml");
  std::ostringstream text;
  text << in.rdbuf();
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
